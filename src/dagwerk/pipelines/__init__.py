"""Pipeline files: YAML or JSON descriptions of a DAG and its run defaults.

See :mod:`dagwerk.pipeline_file` for the public entry points.
"""
