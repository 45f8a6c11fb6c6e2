"""The simulator of `hvdtrain compare`: virtual workers on a virtual clock running the real
schemes' engines (issue 42)."""
