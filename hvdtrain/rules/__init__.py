"""Update rules: the arithmetic of each mode, shared by the real schemes and the simulator."""
