"""engine-sim's log probabilities: greedy (the chosen token first and most likely), distinct alternatives,
the same numbers every time (a function of the token and its position)."""

from steersman.enginesim.logprobs import chat_entries, completion_logprobs

PIECES = ["The", " fleet", ",", " cache", " cache"]


def test_chat_entries_rank_the_chosen_token_first_with_distinct_alternatives():
    for top in (0, 1, 5, 20):
        entries = chat_entries(PIECES, 0, top)
        assert [e["token"] for e in entries] == PIECES
        for e in entries:
            alts = e["top_logprobs"]
            assert len(alts) == top and len({a["token"] for a in alts}) == top
            lps = [a["logprob"] for a in alts]
            assert lps == sorted(lps, reverse=True) and all(lp <= 0 for lp in lps)
            if top:
                assert alts[0]["token"] == e["token"] and alts[0]["logprob"] == e["logprob"]
    assert chat_entries(PIECES, 0, 3) == chat_entries(PIECES, 0, 3)
    assert chat_entries(PIECES[3:4], 3, 3)[0] != chat_entries(PIECES[4:5], 4, 3)[0]  # same token, another position
    assert chat_entries(PIECES[1:2], 1, 3) == chat_entries(PIECES, 0, 3)[1:2]  # a piece alone = in its stream


def test_completion_logprobs_offsets_and_alternatives():
    lp = completion_logprobs(PIECES, 0, 2, 0)
    assert lp["tokens"] == PIECES and lp["text_offset"] == [0, 3, 9, 10, 16]
    assert all(len(d) == 2 and next(iter(d)) == t for d, t in zip(lp["top_logprobs"], PIECES))
    tail = completion_logprobs(PIECES[2:], 2, 2, 9)
    assert {k: v[2:] for k, v in lp.items()} == tail  # a stream's events, one at a time, add up to the whole
    assert all(list(d) == [t] for d, t in zip(completion_logprobs(PIECES, 0, 0, 0)["top_logprobs"], PIECES))
