# The api image, production build: `mango` (serve, migrate, api-key) on
# Debian bookworm-slim, as the chart runs it (charts/mango: user 65532, a
# read-only root, `mango migrate` as init container, then
# `mango serve --no-migrate`). Build from the repository root:
#
#   docker build -f deployments/docker/api.Dockerfile -t mango-api:VERSION .
#
# The build stage is the same as controller.Dockerfile's, word for word, so
# that building both images compiles the workspace once (the layer cache
# shares it). The image holds the api only: no supervisor, no runner.

# The builder's Debian release must match the runtime's (glibc).
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p mango-api -p mango-controller --bin mango --bin mango-worker \
    && install -D -m 0755 target/release/mango /out/mango \
    && install -D -m 0755 target/release/mango-worker /out/mango-worker

FROM debian:bookworm-slim
# CA certificates for whatever the api reaches over TLS; a user of its
# own, 65532, with no home and no shell.
RUN set -eux; \
    apt-get update; \
    apt-get install -y --no-install-recommends ca-certificates; \
    rm -rf /var/lib/apt/lists/*; \
    groupadd --system --gid 65532 mango; \
    useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin mango; \
    find / -xdev -type f -perm /6000 -exec chmod a-s {} +
COPY --from=build /out/mango /usr/local/bin/mango
ENV MANGO_LISTEN_ADDR=0.0.0.0:8080 \
    MANGO_LOG=info
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/mango"]
CMD ["serve"]
