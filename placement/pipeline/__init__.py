"""The data pipeline: export to Parquet, fleet-wide what-if planning (local or Spark), analytics.

Pure modules (no I/O): :mod:`snapshot`, :mod:`fleet`, :mod:`whatif`, :mod:`planning`, :mod:`rows`,
:mod:`history`, :mod:`analytics`, :mod:`spark_master` (parsing). Thin I/O shells: :mod:`export`,
:mod:`inputs`, :mod:`schemas`, :mod:`outputs`, :mod:`spark_plan`, :mod:`report`; the commands are
in ``placement/cli/``. See design/pipeline.md.
"""
