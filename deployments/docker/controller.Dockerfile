# The controller image, production build: `mango-worker` on Debian
# bookworm-slim, run by the chart as `mango-worker kubernetes` (user 65532,
# a read-only root). Build from the repository root:
#
#   docker build -f deployments/docker/controller.Dockerfile -t mango-controller:VERSION .
#
# The build stage is the same as api.Dockerfile's, word for word, so that
# building both images compiles the workspace once (the layer cache shares
# it). The sandbox image (Dockerfile beside this one) is separate: sandboxes
# get the runner only, never the supervisor.

# The builder's Debian release must match the runtime's (glibc).
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p mango-api -p mango-controller --bin mango --bin mango-worker \
    && install -D -m 0755 target/release/mango /out/mango \
    && install -D -m 0755 target/release/mango-worker /out/mango-worker

FROM debian:bookworm-slim
# CA certificates for the api if it is reached over TLS (the Kubernetes
# API's own CA comes with the ServiceAccount); a user of its own, 65532.
RUN set -eux; \
    apt-get update; \
    apt-get install -y --no-install-recommends ca-certificates; \
    rm -rf /var/lib/apt/lists/*; \
    groupadd --system --gid 65532 mango; \
    useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin mango; \
    find / -xdev -type f -perm /6000 -exec chmod a-s {} +
COPY --from=build /out/mango-worker /usr/local/bin/mango-worker
ENV MANGO_METRICS_ADDR=0.0.0.0:9464 \
    MANGO_LOG=info
USER 65532:65532
EXPOSE 9464
ENTRYPOINT ["/usr/local/bin/mango-worker"]
CMD ["kubernetes"]
