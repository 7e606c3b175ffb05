"""``make soak`` for three and a half minutes, as ``make test`` runs it: a three-node cluster, a real scheduler
on the CeleryExecutor (two workers) over three pipelines (two every minute through a Spark Connect
server, one stream), faults from a fixed seed, the operator's REST actions, then the audit: every
number must be zero.

The hour-long soak is ``make soak`` (docs/soak.md); this run is the same code, shorter: its faults
are the seed's first ones (a stranger's transaction is not among them: it is alerted only after
the watchdog's threshold of six minutes)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration

#: Three and a half minutes of load and faults (the shortest soak with two faults: none comes in
#: its first minute or its last), the world's start (a cluster, PostgreSQL, Airflow, Spark
#: Connect: about two minutes on 2 busy cores) and the catch-up after (a retry, a minute's runs).
SOAK_MINUTES = 3.5
#: Its faults: a broker stopped past the clients' timeout, then a Celery worker's process group
#: killed (its tasks die with it; the stream's process, if it ran there, is left to stop by itself).
#: Airflow's backfills have tests of their own (test_backfill.py).
SEED = 535


@pytest.mark.timeout(1800)
def test_a_short_soak_under_faults_audits_to_zero(tmp_path, free_ports):
    from kafka_eos_lab.soak.faults import schedule
    from kafka_eos_lab.soak.run import run

    assert [kind for _, kind in schedule(SEED, SOAK_MINUTES)] == ["broker_stop", "worker_kill"]
    result = run(tmp_path / "soak", SOAK_MINUTES, SEED, base_port=free_ports(12))
    report = result.report.read_text()
    assert result.passed, report
    # The audit ran on what the soak produced: orders in every output, the faults in the report.
    source = next(c for c in result.checks if c.name == "committed source records")
    assert int(source.detail.split()[0]) > 1000, source
    assert "broker_stop" in report and "airflow celery-worker-" in report
    assert "## Recovery" in report and "worker_kill" in report.split("## Recovery")[1]
    assert any(c.name.startswith("watchdog runs failed") for c in result.checks), [c.name for c in result.checks]
