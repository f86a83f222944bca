"""The controller's decisions: pure functions and state, time passed in, no I/O."""
