"""--inject-faults: a schedule of faults (a kill, a freeze, a slowdown, an exception) that fire
in the training processes at given global steps, the same kind of harness torchft and
TorchElastic test with, one language for every scheme. schedule.py reads the text, actions.py
does the harm and remembers what fired, inject.py is the step hook that decides when."""
