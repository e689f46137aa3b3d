"""Coverage-guided fuzzing of vkdelegate's untrusted-input entry points.

Three targets (``fuzz.targets``): the delegate blob reader with ``load_delegate`` and one
execute, ``vkdelegate.load`` with one call per method, and ``vkdelegate inspect``. The
rule they check: only ``VkDelegateError`` (and its subclasses) may leave the API; any
other exception, an input that runs longer than 5 s, or one that grows memory past the
budget is a finding. ``python -m fuzz.run`` builds seeds (``fuzz.corpus``) and runs
each target under atheris (libFuzzer) in a child process; see docs/FUZZING.md.
"""
