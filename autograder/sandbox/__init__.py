"""The untrusted side of the process boundary, and its jail.

``forkserver`` (a fresh interpreter that never imports the reference, a stage spec or an
expected value) forks one ``child`` per submission, in a box of its own (``jail``: PID,
network, mount, IPC and UTS namespaces, a read-only view, a cgroup); ``confine`` applies
the process's layers to that child before student code runs. This package imports the runtime (the
call protocol the child speaks) and never the grader (tests/test_architecture.py).
"""
