"""Engine lifecycles behind one Protocol, picked by the scenario's ``engine.kind``."""

from . import builtin as builtin
