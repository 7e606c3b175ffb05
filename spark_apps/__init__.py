"""spark-submit entry points and the PySpark transforms they run (docs/architecture.md, "Layout")."""
