"""The uuid chains' seam (pvisor.adapters.native.uuid_chain.CompactChain), driven directly: lines
added as a file gives them, a lost parent mended, the leaf chosen by conversation depth or by the
hint, the walk from the root."""

from __future__ import annotations

from pvisor.adapters.native.diagnostics import Diagnostics
from pvisor.adapters.native.uuid_chain import CompactChain

USER, ASSISTANT, UI = 1, 2, 0


def _chain() -> tuple[CompactChain, Diagnostics]:
    chain = CompactChain(str.lower, (USER, ASSISTANT))
    diag = Diagnostics("s.jsonl")
    chain.add("A", None, 1, USER)
    chain.add("B", "a", 2, ASSISTANT)
    chain.add("P", "b", 3, UI)  # a progress line after the reply
    chain.add("X", "a", 4, UI)  # a UI line forking from the prompt
    chain.add("C", "lost", 5, USER)  # its parent's line was lost
    chain.add("D", "c", 6, ASSISTANT)
    return chain, diag


def test_a_lost_parent_continues_from_the_line_before_and_the_longest_conversation_is_walked():
    chain, diag = _chain()
    chain.mend(diag)
    assert [str(w) for w in diag.warnings] == [
        "line 5: broken_chain: parent uuid lost is not in the file; continued from line 4, "
        "the chain line before it"
    ]
    depth, talk = chain.depths()
    leaf = chain.leaf(depth, None, talk)
    # D's chain holds three user and assistant lines (A, C, D), P's two (A, B)
    assert talk[leaf] == 3 and [chain.line[i] for i in chain.walk(leaf)] == [1, 4, 5, 6]


def test_the_hint_picks_the_leaf_among_the_lines_below_it_and_keys_are_the_given_form():
    chain, diag = _chain()
    chain.mend(diag)
    depth, talk = chain.depths()
    leaf = chain.leaf(depth, "B", talk)  # the key function reads "B" as "b"
    assert [chain.line[i] for i in chain.walk(leaf)] == [1, 2, 3]
    assert set(chain.ids) == {"a", "b", "p", "x", "c", "d"}


def test_a_repeated_uuid_replaces_the_line_in_its_place():
    chain = CompactChain(str.lower, (USER, ASSISTANT))
    chain.add("a", None, 1, USER)
    assert chain.add("b", "a", 2, ASSISTANT) == (1, False)
    assert chain.add("b", "a", 7, ASSISTANT) == (1, True)
    assert list(chain.line) == [1, 7] and list(chain.parent) == [-1, 0]
