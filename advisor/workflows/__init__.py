"""One orchestrator per command, each reading top to bottom as the stages it runs:
:mod:`~advisor.workflows.search`, :mod:`~advisor.workflows.export`,
:mod:`~advisor.workflows.recheck`. :mod:`~advisor.workflows.context` wires the model side
(load, tokens, calibration, reference, energy) once per run; :mod:`~advisor.workflows.progress`
reports progress on a terminal and off it.
"""
