"""spark-submit entry points and the PySpark transforms they run (DESIGN.md §1)."""
