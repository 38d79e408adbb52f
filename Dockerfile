# One image for every agentrun process: `agentrun server`, `agentrun executor`,
# `agentrun migrate`, the sandboxes (`python -m sandbox ...`). docker-compose.yml
# runs them against Postgres and Redis.
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
# Not root: the processes need nothing privileged.
RUN useradd --create-home --uid 10001 agentrun
WORKDIR /app

# Dependencies first (the layer is reused while only the code changes).
COPY pyproject.toml README.md ./
COPY clients/python/ clients/python/
COPY agentrun_cli/ agentrun_cli/
COPY control_plane/ control_plane/
COPY executor/ executor/
COPY faults/ faults/
COPY ground/ ground/
COPY telemetry/ telemetry/
COPY sandbox/ sandbox/
COPY migrations/ migrations/
COPY examples/ examples/
# Editable, as `make venv` installs it: migrations/ is read from beside the code.
RUN pip install -e . && mkdir -p /kms /secrets && chown agentrun /kms /secrets

USER agentrun
EXPOSE 50051 8080
CMD ["agentrun", "--help"]
