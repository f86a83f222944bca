"""The replica step: the rank protocol, the coordinator, their messages and the controller client."""
