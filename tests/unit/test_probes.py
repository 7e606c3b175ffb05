"""The commit path's points (kafka_eos.probes) do nothing without a probe: a deployment that
carries the fault settings in its environment, with no probe named, is not crashed by them."""

import os
import subprocess
import sys


def _run(env: dict) -> subprocess.CompletedProcess:
    code = ("from kafka_eos import probes, txn\n"
            "probes.point('before_commit'); probes.point('after_produce')\n"
            "print(probes._probe is None, probes.armed('before_commit'), probes.carried())\n")
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)


def test_without_a_probe_the_points_are_inert_whatever_the_environment_asks():
    env = {k: v for k, v in os.environ.items() if k != "KAFKA_EOS_PROBES"}
    done = _run({**env, "KAFKA_EOS_CRASH_AT": "before_commit", "KAFKA_EOS_PAUSE_AT": "after_produce"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "False", "{}"]


def test_with_the_labs_probe_named_the_same_point_kills_the_process():
    env = {**os.environ, "KAFKA_EOS_PROBES": "kafka_eos_lab.faults", "KAFKA_EOS_CRASH_AT": "before_commit"}
    done = _run(env)
    assert done.returncode == -9, (done.returncode, done.stderr)  # SIGKILL at the point


def test_a_probe_module_that_is_not_there_leaves_the_points_inert_and_says_so():
    env = {**os.environ, "KAFKA_EOS_PROBES": "kafka_eos_lab_absent.faults", "KAFKA_EOS_CRASH_AT": "before_commit"}
    done = _run(env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "False", "{}"]
    assert "KAFKA_EOS_PROBES=kafka_eos_lab_absent.faults: no probe installed" in done.stderr
