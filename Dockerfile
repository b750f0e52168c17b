# syntax=docker/dockerfile:1
#
# authd container image.
#
#   docker build -t authd .
#   docker run --rm -p 50051:50051 authd            # SQLite in /var/lib/authd, random token key
#
# Two stages: a Rust toolchain builds the release binary; the runtime image holds
# only that binary and what it links against (glibc and libgcc, nothing else: TLS
# to PostgreSQL is rustls with its own roots, so there is no OpenSSL). It runs as a
# non-root user and works with a read-only root filesystem.

ARG RUST_VERSION=1.95

# ---- build ------------------------------------------------------------------
FROM rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src

# 1. Dependencies only: the manifests, build.rs, the proto and data/ (build.rs compiles
#    the proto and builds the password blocklist from data/), with empty targets. This
#    layer is rebuilt only when Cargo.toml, Cargo.lock, build.rs, the proto or data/
#    change, not on every source edit. The PBKDF2 engine is a dependency, built here
#    whole. The load generator is a workspace member: only its manifest is needed
#    (with empty targets), never built.
COPY Cargo.toml Cargo.lock build.rs ./
COPY pbkdf2-lanes ./pbkdf2-lanes
COPY authbench/Cargo.toml ./authbench/
COPY proto ./proto
COPY data ./data
RUN mkdir -p src authbench/src \
    && echo 'fn main() {}' > src/main.rs \
    && touch src/lib.rs authbench/src/lib.rs \
    && echo 'fn main() {}' > authbench/src/main.rs \
    && cargo build --release --locked -p authd --bin authd \
    && rm -rf src

# 2. The sources. COPY keeps the files' own modification times, which can be older
#    than the empty targets built above: touch them so cargo rebuilds the crate.
COPY migrations ./migrations
COPY src ./src
RUN find src -name '*.rs' -exec touch {} + \
    && cargo build --release --locked -p authd --bin authd \
    && install -D -m 0755 target/release/authd /out/authd \
    && install -d -m 0750 /out/data

# ---- runtime ----------------------------------------------------------------
# distroless "cc": glibc, libgcc and CA certificates; no shell, no package manager.
# The :nonroot variant runs as uid/gid 65532.
FROM gcr.io/distroless/cc-debian12:nonroot AS runtime

COPY --from=build /out/authd /usr/local/bin/authd
# Where the default SQLite database lives; with PostgreSQL (AUTHD_DATABASE_URL=postgres://…)
# nothing is written to disk at all.
COPY --from=build --chown=65532:65532 /out/data /var/lib/authd
VOLUME ["/var/lib/authd"]

ENV AUTHD_LISTEN=0.0.0.0:50051 \
    AUTHD_DATABASE_URL=sqlite:///var/lib/authd/authd.db \
    AUTHD_LOG_FORMAT=json

USER 65532:65532
# gRPC; the health-only port for probes (AUTHD_HEALTH_LISTEN); GET /metrics for
# Prometheus (AUTHD_METRICS_LISTEN).
EXPOSE 50051 50052 9090

# `authd health` asks the server's own grpc.health.v1 service (on loopback, at the
# health-only port) and exits 0 only when it is SERVING.
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["/usr/local/bin/authd", "health", "--service", "auth.v1.AuthService"]

# SIGTERM starts a graceful drain (AUTHD_DRAIN_TIMEOUT, 20s by default): give
# `docker stop` more than that, e.g. `docker stop -t 30`.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/authd"]
CMD ["serve"]
