"""Reading and rendering what agents send and save: wire protocols, native formats, launch profiles.

Depends on ``pvisor.journal`` only.
"""
