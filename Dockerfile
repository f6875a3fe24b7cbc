# The image of `tfstackplan serve` (docs/deploy.md#in-a-container): one static binary built
# without cgo (SQLite is pure Go) on an empty base image (scratch: no shell, no package
# manager, nothing else to patch), run as an unprivileged user. The root filesystem may be
# read-only: the process writes only under /data (the SQLite database and its temporary
# files), a volume. Checked by internal/release and, with docker, scripts/check-image.sh.
#
#   docker build --build-arg VERSION=v0.1.0 -t tfstackplan:v0.1.0 .

# The build runs on the builder's own platform and cross-compiles for the image's.
FROM --platform=$BUILDPLATFORM golang:1.26 AS build
ARG TARGETOS=linux
ARG TARGETARCH=amd64
ARG VERSION=
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH go build -trimpath -ldflags="-s -w -X github.com/tfstackplan/tfstackplan/internal/buildinfo.version=$VERSION" -o /out/tfstackplan ./cmd/tfstackplan
RUN mkdir -p /out/data

FROM scratch
ARG VERSION=
LABEL org.opencontainers.image.title="tfstackplan" \
      org.opencontainers.image.description="tfstackplan serve: the control plane of tfstackplan" \
      org.opencontainers.image.source="https://github.com/tfstackplan/tfstackplan" \
      org.opencontainers.image.version="$VERSION"
# The server verifies Google's and GitHub's ID token signing keys over HTTPS.
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /out/tfstackplan /usr/local/bin/tfstackplan
COPY --from=build --chown=65532:65532 /out/data /data
USER 65532:65532
# The default --db, sqlite:./tfstackplan.db, is /data/tfstackplan.db; SQLite's temporary files
# go to the working directory too (the image has no /tmp).
WORKDIR /data
VOLUME /data
EXPOSE 8080
# Flags given to `docker run` come after these; a later --listen or --db wins.
ENTRYPOINT ["/usr/local/bin/tfstackplan", "serve", "--listen=:8080"]
