import pickle
import textwrap

import pytest

from rljax.rewards import CustomRewardError, FileRewardFn, RewardManager, custom_reward_fn_from_config, load_function


def write(tmp_path, body, name="my_reward.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


BODY = """
    def compute_score(data_source, solution_str, ground_truth, extra_info=None, scale=1.0):
        return scale * float(solution_str.strip() == ground_truth)

    def other(data_source, solution_str, ground_truth, extra_info=None):
        return {"score": 0.5, "length": len(solution_str)}
"""


def test_load_and_call(tmp_path):
    path = write(tmp_path, BODY)
    fn = custom_reward_fn_from_config({"path": path, "reward_kwargs": {"scale": 2.0}})
    assert fn(data_source="d", solution_str="a ", ground_truth="a") == 2.0
    other = custom_reward_fn_from_config({"path": path, "name": "other"})
    assert other("d", "abc", "x") == {"score": 0.5, "length": 3}
    # Picklable by path, so it can go to worker processes.
    assert pickle.loads(pickle.dumps(fn))(data_source="d", solution_str="a", ground_truth="a") == 2.0


def test_no_path_means_no_custom_fn():
    assert custom_reward_fn_from_config(None) is None
    assert custom_reward_fn_from_config({"path": None, "name": "compute_score"}) is None


def test_missing_file(tmp_path):
    with pytest.raises(CustomRewardError, match="no such file"):
        custom_reward_fn_from_config({"path": str(tmp_path / "nope.py")})


def test_missing_function_lists_available(tmp_path):
    path = write(tmp_path, BODY, "rf2.py")
    with pytest.raises(CustomRewardError, match=r"no function 'score_fn'.*compute_score"):
        load_function(path, "score_fn")


def test_import_error_is_reported(tmp_path):
    path = write(tmp_path, "import not_a_module_xyz\n", "broken.py")
    with pytest.raises(CustomRewardError, match="ModuleNotFoundError"):
        FileRewardFn(path).load()


def test_unknown_config_key(tmp_path):
    with pytest.raises(CustomRewardError, match="unknown key"):
        custom_reward_fn_from_config({"path": write(tmp_path, BODY, "rf3.py"), "fn": "x"})


def test_manager_with_custom_file_in_processes(tmp_path):
    path = write(tmp_path, BODY, "rf4.py")
    batch = [{"data_source": "anything", "solution_str": s, "ground_truth": "a"} for s in ("a", "b", "a")]
    with RewardManager.from_config(
        {"num_workers": 1, "timeout_s": 30}, {"path": path, "name": "compute_score", "reward_kwargs": {"scale": 3.0}}
    ) as manager:
        assert manager(batch).scores.tolist() == [3.0, 0.0, 3.0]
