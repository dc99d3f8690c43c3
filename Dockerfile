# The operator image: slim Python, runtime dependencies only, non-root.
# BASE is any image with python3 (3.11+): the public python:3.11-slim by default; our development machines, which
# reach no registry, build it on a local Debian base (testbed/images.py, build_operator).
ARG BASE=python:3.11-slim
# The platforms the build runs on and builds for. BuildKit sets both; buildah 1.28 (Debian 12's) expands them in FROM
# only when they are given as --build-arg, and takes a stage's FROM --platform for the stages after it: the final
# stage names its platform too (scripts/release.sh passes both, one platform a build).
ARG BUILDPLATFORM
ARG TARGETPLATFORM

# The build stage runs on the build machine's own platform, whatever the target's: pip installs the dependencies
# there for the target's platform (its binary wheels: --platform, --only-binary), so building an arm64 image on amd64
# emulates nothing (its build took 59-63 s here; with pip under qemu, 253 s). They are requirements.lock's, each by
# version and hash (scripts/lock.sh writes it from pyproject.toml): a changed or added file on PyPI is refused.
FROM --platform=$BUILDPLATFORM ${BASE} AS build
ARG TARGETARCH
WORKDIR /src
COPY pyproject.toml README.md requirements.lock ./
COPY operator ./operator
RUN set -eu; \
    machine=$(case "${TARGETARCH:-}" in amd64) echo x86_64 ;; arm64) echo aarch64 ;; *) uname -m ;; esac); \
    python3 -m venv /tmp/pip; \
    /tmp/pip/bin/pip wheel --quiet --no-cache-dir --no-deps --wheel-dir /tmp/wheels .; \
    platforms=$(python3 -c 'import platform, sys; libc = platform.libc_ver()[1].split("."); \
        tags = [f"manylinux_2_{m}_{sys.argv[1]}" for m in range(17, int(libc[1]) + 1)]; \
        print(" ".join(f"--platform {t}" for t in ["manylinux2014_" + sys.argv[1], *tags]))' "$machine"); \
    version=$(python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")'); \
    target="--quiet --no-cache-dir --target /opt/cpullm/lib --only-binary=:all: --implementation cp"; \
    target="$target --python-version $version $platforms"; \
    /tmp/pip/bin/pip install $target --require-hashes -r requirements.lock; \
    /tmp/pip/bin/pip install $target --no-deps /tmp/wheels/*.whl; \
    rm -rf /opt/cpullm/lib/bin; \
    mkdir /opt/cpullm/bin; \
    printf '#!/bin/sh\nPYTHONPATH=/opt/cpullm/lib${PYTHONPATH:+:$PYTHONPATH} exec python3 -m cpullm "$@"\n' \
        > /opt/cpullm/bin/cpullm; \
    chmod 755 /opt/cpullm/bin/cpullm

FROM --platform=$TARGETPLATFORM ${BASE}
COPY --from=build /opt/cpullm /opt/cpullm
# USER: the UID has no passwd entry, and Kopf names the operator after the user when POD_ID is not set.
ENV PATH=/opt/cpullm/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 USER=cpullm
USER 65532:65532
ENTRYPOINT ["cpullm"]
CMD ["run"]
