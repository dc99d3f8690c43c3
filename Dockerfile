# The operator image: slim Python, runtime dependencies only, non-root.
# BASE is any image with python3 (3.11+) and its venv module: the public python:3.11-slim by default; our
# development machines, which reach no registry, build it on a local Debian base (testbed/images.py, build_operator).
ARG BASE=python:3.11-slim

FROM ${BASE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
# A virtualenv, so the install does not depend on where the base's Python keeps its site-packages.
RUN python3 -m venv /opt/cpullm && /opt/cpullm/bin/pip install --no-cache-dir . && rm -rf /opt/cpullm/bin/pip*

FROM ${BASE}
COPY --from=build /opt/cpullm /opt/cpullm
# USER: the UID has no passwd entry, and Kopf names the operator after the user when POD_ID is not set.
ENV PATH=/opt/cpullm/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 USER=cpullm
USER 65532:65532
ENTRYPOINT ["cpullm"]
CMD ["run"]
