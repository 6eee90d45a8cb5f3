# The jazzmine worker's image: the static worker binary (make build: CGO_ENABLED=0)
# and nothing else. `make worker-image` (images.sh worker) builds it as
# jazzmine-worker:latest.
#
# It runs as root: it drives the Docker engine through the host's socket mounted at
# /var/run/docker.sock, which is root on the host whatever the user in here.
# `worker serve` writes nothing but the embedded NATS server's store (--store-dir,
# only when NATS_URL is unset): give it a volume or a tmpfs then.
FROM scratch
COPY worker /worker
EXPOSE 4222 9464
ENTRYPOINT ["/worker"]
CMD ["serve", "--config", "/etc/jazzmine/config.yaml", "--metrics-addr", "0.0.0.0:9464"]
LABEL org.opencontainers.image.title="jazzmine worker"
