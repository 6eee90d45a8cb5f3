# The NATS server image for hosts that cannot pull the official one: `make nats-image`
# (images.sh nats) builds it as nats:<version of the nats-server module in go.mod>,
# around a static nats-server built from that module. Its layout is the official
# scratch image's: /nats-server, a default /nats-server.conf, the same ports, entrypoint
# and command, so a compose file or a `docker run` written for one runs the other.
FROM scratch
COPY nats-server /nats-server
COPY nats-server.conf /nats-server.conf
EXPOSE 4222 6222 8222
ENTRYPOINT ["/nats-server"]
CMD ["--config", "nats-server.conf"]
LABEL org.opencontainers.image.description="nats-server built locally from the Go module (jazzmine make nats-image)"
