"""The job secret of this test session's trainers (fresh each session; processes get it in
their environment, as the agent hands it to the trainers it starts)."""

from __future__ import annotations

from protos import job_secret

SECRET_HEX = job_secret.generate()
SECRET = job_secret.parse(SECRET_HEX, "the test session")
#: what a trainer process needs in its environment
ENV = {job_secret.ENV_JOB_SECRET: SECRET_HEX}
