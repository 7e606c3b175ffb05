"""kafka-eos's lab: the benchmarks (``bench``), the fault matrix (``chaos``), the soak (``soak``)
and the fault probe they and the tests install (``faults``). It lives in the repository beside
the library and never in the wheel a user installs: ``make install`` puts it on the development
environment's path.

Importing it installs the fault probe in this process and, through the environment, in every
process it starts (:data:`kafka_eos.probes.PROBES_ENV`).
"""

import os

#: kafka_eos.probes.PROBES_ENV (tests/unit/test_spark_connect_settings.py holds them equal).
PROBES_ENV = "KAFKA_EOS_PROBES"

os.environ.setdefault(PROBES_ENV, "kafka_eos_lab.faults")

from kafka_eos_lab import faults  # noqa: E402,F401 - installs the probe in this process
