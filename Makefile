# kafka-eos: the two commands a new user needs are `make demo` and `make test`.
# Each installs what it needs on first use (virtualenv, pinned requirements, the JVM jars) and
# reuses it afterwards.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
JARS   := .local/jars
MVN    := mvn -q -B -s jvm/settings.xml -f jvm/pom.xml

.PHONY: demo demo-avro test test-quick chaos soak bench bench-stream bench-page bench-scale structure wheel compat compat-floors setup install jars debian-packages postgres compose-tool kafka-start kafka-stop cluster-up cluster-down airflow-up airflow-down clean

demo: setup
	$(VENV)/bin/kafka-eos demo

# The Avro example (docs/formats.md): orders in Avro through the embedded Schema Registry, their
# schema evolved mid-stream, out in Avro; checked against what was produced.
demo-avro: setup
	$(VENV)/bin/kafka-eos demo --format avro

# Three workers (pytest-xdist) on two cores for the tests that work, and a fourth for the modules
# marked `waits` only (a retention's sleeps, a transaction's timeout, a stream's batches): sampled
# over a whole run, two workers left the CPU idle 29% of the time, three 14% (mostly while two of
# them waited at once); a fourth taking any test slowed every test beside it. They share one
# broker; the tests on the Airflow deployment, and those of a module with a cluster of its own,
# each stay on one worker (tests/conftest.py).
TEST_WORKERS ?= 4

test: setup
	@$(MAKE) --no-print-directory debian-packages PACKAGES="$(TEST_PACKAGES)"
	@echo "make test: every test, on $(TEST_WORKERS) workers: 18-28 minutes on 2 cores, by the host's speed (make test-quick: about a minute)"
	$(VENV)/bin/pytest -n $(TEST_WORKERS) --dist loadscope -m "not chaos" $(PYTEST_ARGS)

# The edit loop: the unit tests and the quick integration tests (marked quick) on the shared
# broker and SparkSession; make test still runs everything. Two workers: mostly CPU-bound tests.
QUICK_WORKERS ?= 2

test-quick: setup
	@echo "make test-quick: unit tests and quick integration tests (about a minute)"
	$(VENV)/bin/pytest -n $(QUICK_WORKERS) -m "quick or not integration" tests/unit tests/integration $(PYTEST_ARGS)

# The structure's measures (docs/architecture.md, "Structure"): import cycles, imports from a lower
# layer to a higher one, imports inside functions, switches on a sink's kind or scope.
structure:
	python3 tests/structure.py

# Debian's packages the tests start, each installed only where missing, all in one apt-get run (on a
# fresh machine each apt-get's index update costs seconds): `make debian-packages PACKAGES="..."`.
# - postgresql: the SQL sink is tested on PostgreSQL too (the tests start throwaway clusters of
#   their own on 127.0.0.1);
# - redis-server: Airflow's CeleryExecutor takes Redis as Celery's broker (kafka-eos airflow start
#   --executor celery, the deployment tests, the soak), started by them on 127.0.0.1;
# - chromium, chromium-driver: the browser tests drive Debian's Chromium with Selenium (the system
#   driver: nothing is downloaded at run time);
# - docker-compose: the compose-file test runs its `config` (or the docker compose plugin where
#   present); no Docker engine is needed for it.
TEST_PACKAGES = postgresql redis-server chromium chromium-driver docker-compose
debian-packages:
	@missing=""; for package in $(PACKAGES); do \
	  case $$package in \
	    postgresql) ls /usr/lib/postgresql/*/bin/initdb ;; \
	    chromium-driver) command -v chromedriver ;; \
	    docker-compose) command -v docker-compose || docker compose version ;; \
	    *) command -v $$package ;; \
	  esac >/dev/null 2>&1 || missing="$$missing $$package"; \
	done; \
	[ -z "$$missing" ] || { \
	  echo "installing from Debian's packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; }

# The two a message of the code names (a missing PostgreSQL server, a missing Compose tool).
postgres:
	@$(MAKE) --no-print-directory debian-packages PACKAGES=postgresql
compose-tool:
	@$(MAKE) --no-print-directory debian-packages PACKAGES=docker-compose

# The Kafka broker versions docs/versions.md claims: the exactly-once and hung-transaction tests
# against a broker of each version, started from its own jars (Maven Central) on 127.0.0.1:19400.
COMPAT_KAFKA ?= 3.3.2 4.4.0

compat: setup
	@rm -f .local/compat/results.txt; failed=0; \
	for v in $(COMPAT_KAFKA); do \
	  home=.local/compat/$$v; \
	  test -f $$home/jars/kafka/.resolved || { rm -rf $$home/jars/kafka && \
	    $(MVN) -P broker -Dkafka.version=$$v dependency:copy-dependencies -DincludeScope=runtime \
	      -DoutputDirectory=../$$home/jars/kafka && touch $$home/jars/kafka/.resolved; } || exit 1; \
	  KAFKA_EOS_HOME=$$home KAFKA_EOS_LOCAL_PORT=19400 $(VENV)/bin/kafka-eos kafka start >/dev/null || exit 1; \
	  KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:19400 $(VENV)/bin/pytest -q -p no:cacheprovider \
	    tests/integration/test_exactly_once.py tests/integration/test_hung_transactions.py; status=$$?; \
	  KAFKA_EOS_HOME=$$home KAFKA_EOS_LOCAL_PORT=19400 $(VENV)/bin/kafka-eos kafka stop >/dev/null; \
	  [ $$status -eq 0 ] && result=passed || { result=FAILED; failed=1; }; \
	  echo "compat: Kafka $$v: $$result" | tee -a .local/compat/results.txt; \
	done; cat .local/compat/results.txt; exit $$failed

# The other end of the declared ranges: the wheel installed into a fresh virtualenv with every
# requirement pyproject.toml declares (and the spark extra) at its lowest declared version, Airflow
# included, then a user's first pipeline end to end (kafka-eos new, a DAG file, `airflow dags test`
# with spark-submit, exactly once): tests/integration/test_wheel_install.py at the floors.
compat-floors: setup
	KAFKA_EOS_WHEEL_AT=floors $(VENV)/bin/pytest -q -p no:cacheprovider tests/integration/test_wheel_install.py

# The distribution a user installs (docs/first-pipeline.md): dist/kafka_eos-<version>-py3-none-any.whl.
# build/ goes first: setuptools would put an earlier build's files (since removed) in the wheel.
# The wheel, built by `python -m build` in an isolated build environment (only setuptools, from
# pyproject.toml's build-system) from this checkout, the Spark Connect plugin jar always inside:
# the build fails without it.
wheel: setup
	rm -rf build dist/kafka_eos-*.whl
	$(PY) -m build --wheel --outdir dist .
	$(PY) -c "import glob, sys, zipfile; (w,) = glob.glob('dist/kafka_eos-*.whl'); \
	  sys.exit(0 if 'kafka_eos/jars/kafka-eos-connect.jar' in zipfile.ZipFile(w).namelist() \
	  else w + ': no kafka_eos/jars/kafka-eos-connect.jar in it (make jars builds it)')"
	@ls dist/kafka_eos-*.whl

# The virtualenv and the JVM jars, side by side: pip installs on one core while Maven resolves and
# builds the jars on the other (on a clean clone, 67 s rather than 79 s one after the other).
setup:
	@$(MAKE) --no-print-directory -j2 install jars

install: $(VENV)/.installed

# The package as pyproject.toml declares it (with the PostgreSQL extra), at the tested pins
# (requirements.txt as constraints), and the test tools (requirements-dev.txt).
$(VENV)/.installed: requirements.txt requirements-dev.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@# --no-compile, then compileall on every core: pip byte-compiles each package as it unpacks it,
	@# on one core (a fresh install: about 60 s of wall time rather than 70 on this machine).
	$(PY) -m pip install -q --no-compile -c requirements.txt -r requirements-dev.txt -e ".[spark,postgres,sqlite,celery,protoc,metrics,openlineage,iceberg]"
	@# The lab (include/kafka_eos_lab: benchmarks, fault matrix, soak, the fault probe) is the
	@# repository's and never in the wheel: on this environment's path through a path file.
	echo "$(CURDIR)/include" > "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/kafka_eos_lab.pth"
	@# The installed packages and the checkout's own modules byte-compiled once (pip's editable
	@# install never compiles the checkout): where PYTHONDONTWRITEBYTECODE is set, as on the CI
	@# machine, every process that imports kafka-eos would compile it again (0.2-0.3 CPU-s each; make
	@# test starts hundreds). An edited module's stale file is ignored by Python, which compiles the
	@# source instead. A package's file that does not compile is left as pip would leave it:
	@# compileall names it, and the install goes on.
	$(PY) -m compileall -q -j 0 "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" || true
	$(PY) -m compileall -q -j 0 include plugins spark_apps dags
	touch $@

jars: $(JARS)/kafka/.resolved $(JARS)/spark/.resolved $(JARS)/registry/.resolved $(JARS)/connect/.built \
      $(JARS)/iceberg-rest/.resolved

$(JARS)/kafka/.resolved: jvm/pom.xml
	rm -rf $(JARS)/kafka
	$(MVN) -P broker dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory=../$(JARS)/kafka
	touch $@

# Iceberg's own REST catalog server, for the Iceberg sink's REST catalog tests
# (jvm/iceberg-rest/LoopbackRestCatalog.java runs on these and pyspark's Hadoop jars).
$(JARS)/iceberg-rest/.resolved: jvm/pom.xml
	rm -rf $(JARS)/iceberg-rest
	$(MVN) -P iceberg-rest dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory=../$(JARS)/iceberg-rest
	touch $@

$(JARS)/spark/.resolved: jvm/pom.xml
	rm -rf $(JARS)/spark
	$(MVN) -P spark dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory=../$(JARS)/spark
	touch $@

# kafka-eos's JVM classes (jvm/connect, Java against Spark's own jars): the Spark Connect server
# plugin (per_partition scope commits through Connect in one pass) and the Java Kafka client's
# OAUTHBEARER login through a Python token callback; every Spark application kafka-eos starts has it.
# A copy goes into the package (include/kafka_eos/jars/, not in git): the wheel carries it.
$(JARS)/connect/.built: jvm/connect/pom.xml $(wildcard jvm/connect/src/main/java/io/kafkaeos/*/*.java)
	rm -rf $(JARS)/connect jvm/connect/target include/kafka_eos/jars
	mvn -q -B -s jvm/settings.xml -f jvm/connect/pom.xml package
	mkdir -p $(JARS)/connect include/kafka_eos/jars
	cp jvm/connect/target/kafka-eos-connect.jar $(JARS)/connect/
	cp jvm/connect/target/kafka-eos-connect.jar include/kafka_eos/jars/
	rm -rf jvm/connect/target
	touch $@

# PostgreSQL's JDBC driver: the bench's baseline for the SQL sink (Spark's own JDBC writer).
$(JARS)/jdbc/.resolved: jvm/pom.xml
	rm -rf $(JARS)/jdbc
	$(MVN) -P jdbc dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory=../$(JARS)/jdbc
	touch $@

# The Schema Registry (Apicurio Registry, from Maven Central): Quarkus's build step makes a runner
# jar and its lib/ folder out of the registry's application jar (jvm/registry/pom.xml).
$(JARS)/registry/.resolved: jvm/registry/pom.xml
	rm -rf $(JARS)/registry jvm/registry/target
	mvn -q -B -s jvm/settings.xml -f jvm/registry/pom.xml -DskipTests package
	mkdir -p $(JARS)/registry
	cp -r jvm/registry/target/lib jvm/registry/target/*-runner.jar $(JARS)/registry/
	rm -rf jvm/registry/target
	touch $@

# The fault matrix: every scenario (brokers killed, terminated, stopped; the driver and executors
# killed at each commit step; a zombie; a stalled producer) on each sink, on a local three-node
# cluster; a table on stdout, exit 1 on any anomaly. CHAOS_ARGS: e.g. --quick, --sink sql,
# --scenario SIGSTOP. Then the Celery cells: a worker killed inside a DAG run's commit (Kafka sink
# in both scopes, SQL sink) and under a stream, on a local Airflow with two Celery workers. Then the
# faults inside the read: every kind at every point of a task's input, in each scope, in-process
# and through Spark Connect servers with and without kafka-eos's plugin, and a Spark executor (the
# application's JVM) killed mid-read under spark-submit.
chaos: setup
	@$(MAKE) --no-print-directory debian-packages PACKAGES="postgresql redis-server"
	$(PY) -m kafka_eos_lab.chaos $(CHAOS_ARGS)
	$(VENV)/bin/pytest -q -p no:cacheprovider tests/dags/test_celery_workers.py
	$(VENV)/bin/pytest -q -p no:cacheprovider -m chaos tests/integration/test_read_faults.py \
	  tests/integration/test_spark_connect.py tests/integration/test_transaction_timeout.py

# Hours of operation under faults: three pipelines (two scheduled every minute, one stream) under a
# real scheduler on a three-node cluster, faults at random times from SOAK_SEED (default: a new
# seed, printed), an operator acting through Airflow's REST API, then an audit of every output
# (docs/soak.md). The report and the lag chart go to .local/soak/<time>/report.
SOAK_MINUTES ?= 60

soak: setup
	@$(MAKE) --no-print-directory debian-packages PACKAGES="postgresql redis-server"
	SOAK_MINUTES=$(SOAK_MINUTES) SOAK_SEED=$(SOAK_SEED) $(PY) -m kafka_eos_lab.soak

# Throughput beside plain at-least-once Spark and Kafka's own perf tools, fixed costs, the planner
# and memory (a table on stdout; .local/bench/throughput.json and throughput.png; about 50 minutes on 2 cores).
# BENCH_ARGS: e.g. --records 100000 --sizes 1 --skip airflow,postgres.
# Then the big estate (make bench-scale) and a stream in each scope at 1,000 and 10,000 records/s on
# 3 partitions (its p95 against the targets; about 8 minutes: make bench-stream has the event-driven form). Every part runs; the
# target fails at the end if one of them found an anomaly.
bench: setup $(JARS)/jdbc/.resolved postgres
	$(PY) -m pip install -q -r requirements-bench.txt
	failed=""; \
	$(PY) -m kafka_eos_lab.bench.throughput $(BENCH_ARGS) || failed="$$failed throughput"; \
	$(PY) -m kafka_eos_lab.bench.scale || failed="$$failed scale"; \
	$(PY) -m kafka_eos_lab.bench.stream_latency --forms continuous --rates 1000,10000 --commit atomic || failed="$$failed stream-atomic"; \
	$(PY) -m kafka_eos_lab.bench.stream_latency --forms continuous --rates 1000,10000 --commit per_partition || failed="$$failed stream-per_partition"; \
	if [ -n "$$failed" ]; then echo "make bench: anomalies in:$$failed"; exit 1; fi

# A big estate: 100 pipelines in one folder (the DAG file's parse as the dag-processor measures it,
# a watchdog pass, the operator page, kafka-eos pipelines) and a plan, on a broker of its own before
# and after 3,000 other topics (12,000 partitions) were created beside them. Figures against their
# targets on stdout and in .local/bench/scale.json; about 4 minutes. SCALE_ARGS: e.g. --pipelines 20.
bench-scale: setup
	$(PY) -m kafka_eos_lab.bench.scale $(SCALE_ARGS)

# End-to-end latency and throughput of continuous mode and of event-driven runs (figures on stdout
# and in .local/bench/stream_latency.json; about 15 minutes). BENCH_ARGS: e.g. --forms continuous --rates 1000.
bench-stream: setup
	$(PY) -m kafka_eos_lab.bench.stream_latency $(BENCH_ARGS)

# How long the operator page's read of the cluster takes for 50 pipelines over 1,000 partitions
# (about 6 minutes, most of it setting them up). BENCH_ARGS: e.g. --pipelines 10 --partitions 5.
bench-page: setup
	$(PY) -m kafka_eos_lab.bench.overview $(BENCH_ARGS)

kafka-start: setup
	$(VENV)/bin/kafka-eos kafka start

# A Spark standalone cluster on 127.0.0.1: a master (spark://127.0.0.1:7077, UI on :8090) and two
# workers, state under .local/spark. Point the DAGs at it with
# AIRFLOW_CONN_SPARK_DEFAULT='{"conn_type": "spark", "host": "spark://127.0.0.1", "port": 7077}'.
cluster-up: kafka-start
	$(VENV)/bin/kafka-eos spark start

cluster-down:
	-test -x $(VENV)/bin/kafka-eos && $(VENV)/bin/kafka-eos spark stop

# Airflow's UI and API on http://127.0.0.1:8080 with a real scheduler (login admin; the password
# file is printed), over this project's DAGs and the local broker.
airflow-up: kafka-start
	$(VENV)/bin/kafka-eos airflow start

airflow-down:
	-test -x $(VENV)/bin/kafka-eos && $(VENV)/bin/kafka-eos airflow stop

kafka-stop:
	-test -x $(VENV)/bin/kafka-eos && $(VENV)/bin/kafka-eos kafka stop

clean: airflow-down cluster-down kafka-stop
	rm -rf .local spark-warehouse metastore_db derby.log
