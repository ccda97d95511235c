import pytest

from rljax.evaluation import pass_at_k, sample_sizes, validation_metrics


def test_sample_sizes():
    assert sample_sizes(1) == []
    assert sample_sizes(2) == [2]
    assert sample_sizes(5) == [2, 4, 5]
    assert sample_sizes(8) == [2, 4, 8]


def records(ds, prompt, accs, preds=None, scores=None):
    preds = preds or [None] * len(accs)
    scores = scores or accs
    return [{"data_source": ds, "prompt_index": prompt, "score": s, "acc": a, "pred": p}
            for a, p, s in zip(accs, preds, scores)]


def test_names_and_values():
    recs = (records("openai/gsm8k", 0, [1, 0, 0, 1], ["4", "5", "5", "4"])
            + records("openai/gsm8k", 1, [0, 0, 0, 0], ["1", "2", "3", "1"])
            + records("synthetic/reverse", "p", [1, 1, 0, 1], ["a", "a", "b", "a"]))
    m = validation_metrics(recs)
    g = "openai/gsm8k"
    assert m[f"val-core/{g}/acc/mean@4"] == pytest.approx(0.25)
    assert m[f"val-core/{g}/acc/pass@4"] == pytest.approx(0.5)
    assert m[f"val-aux/{g}/acc/pass@2"] == pytest.approx((pass_at_k(4, 2, 2) + 0) / 2)
    assert m[f"val-core/{g}/acc/best@4/mean"] == pytest.approx(0.5)
    assert m[f"val-aux/{g}/acc/worst@4/mean"] == 0.0
    assert m[f"val-aux/{g}/acc/std@4"] == pytest.approx(0.25)  # (0.5 + 0) / 2
    # maj@4: prompt 0 ties "4" vs "5" -> "4" came first -> correct; prompt 1 -> "1" -> wrong.
    assert m[f"val-core/{g}/acc/maj@4/mean"] == pytest.approx(0.5)
    assert f"val-aux/{g}/acc/maj@2/mean" in m
    # "reward" (the score) is reported too, always auxiliary when "acc" exists.
    assert m[f"val-aux/{g}/reward/mean@4"] == pytest.approx(0.25)
    assert not any(k.startswith(f"val-core/{g}/reward") for k in m)
    assert m["val-core/synthetic/reverse/acc/maj@4/mean"] == 1.0
    assert all(k.startswith(("val-core/", "val-aux/")) for k in m)


def test_reward_is_core_without_acc_and_continuous_scores_have_no_pass():
    recs = [{"data_source": "rm", "prompt_index": 0, "score": s} for s in (0.2, 0.9, -0.3)]
    m = validation_metrics(recs)
    assert m["val-core/rm/reward/mean@3"] == pytest.approx(0.8 / 3)
    assert m["val-core/rm/reward/best@3/mean"] == pytest.approx(0.9)
    assert not any("pass@" in k or "maj@" in k for k in m)


def test_preds_extracted_from_solution_str():
    recs = [{"data_source": "openai/gsm8k", "prompt_index": 0, "score": float(s == "#### 7"), "solution_str": s}
            for s in ("#### 7", "#### 7", "#### 8")]
    m = validation_metrics(recs)
    assert m["val-core/openai/gsm8k/reward/maj@3/mean"] == 1.0
    assert not any("maj@" in k for k in validation_metrics(recs, extract_answers=False))


def test_n_max_decides_core_across_prompt_sizes():
    recs = records("d", 0, [1, 0]) + records("d", 1, [1, 1, 0, 0])
    m = validation_metrics(recs)
    assert "val-core/d/acc/mean@4" in m and "val-aux/d/acc/mean@2" in m


def test_single_sample():
    m = validation_metrics(records("d", 0, [1]) + records("d", 1, [0]))
    assert m["val-core/d/acc/mean@1"] == 0.5 and m["val-core/d/acc/pass@1"] == 0.5


def test_bad_records():
    with pytest.raises(ValueError, match="lacks 'score'"):
        validation_metrics([{"data_source": "d", "prompt_index": 0}])
    partial = [{"data_source": "d", "prompt_index": 0, "score": 1, "acc": 1},
               {"data_source": "d", "prompt_index": 0, "score": 0, "acc": None}]  # e.g. a timed-out sample
    with pytest.raises(ValueError, match="lacks numeric field 'acc'"):
        validation_metrics(partial, missing_value=None)
    assert validation_metrics(partial)["val-core/d/acc/mean@2"] == 0.5
