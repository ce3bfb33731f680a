# Multi-stage build: compile with the Rust toolchain, run on distroless as non-root.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY benches ./benches
RUN cargo build --release --locked --bin divvy

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/divvy /usr/local/bin/divvy
COPY config/example.yaml /etc/divvy/divvy.yaml
USER 65532:65532
EXPOSE 8081 8321 8080
ENTRYPOINT ["/usr/local/bin/divvy"]
CMD ["serve", "--config", "/etc/divvy/divvy.yaml"]
