"""The vocabulary: token bytes, EOS ids and the byte trie of the tokens."""

from __future__ import annotations

import pytest

import adaptrack as at


def test_vocabulary_trie_subtree_is_every_token_with_that_prefix():
    vocab = at.Vocabulary([b"a", b"ab", b"abc", b"b", None, b"ac"], eos_ids=[4], size=8)
    trie = vocab.trie
    node = trie.children[0][ord("a")]
    assert sorted(trie.subtree(node).tolist()) == [0, 1, 2, 5]
    assert vocab.text_ids.tolist() == [0, 1, 2, 3, 5]
    with pytest.raises(ValueError, match="outside"):
        at.Vocabulary([b"a"], eos_ids=[3])
