# The operator image: slim Python, runtime dependencies only, non-root. It cannot be built on our
# development machines (no Docker engine there); the kind e2e path (e2e/kind/run.sh) is where it is used.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
RUN pip install --no-cache-dir --prefix=/install .

FROM python:3.11-slim
COPY --from=build /install /usr/local
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
USER 65532:65532
ENTRYPOINT ["cpullm"]
CMD ["run"]
