# The rankscope sink as a container (docker-compose.yml builds it).
# The sink needs no torch: install rankscope without its dependencies, then the sink's own.
FROM python:3.11-slim
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install --no-cache-dir --no-deps . \
 && pip install --no-cache-dir "opentelemetry-sdk~=1.45" "opentelemetry-exporter-otlp~=1.45" \
        "opentelemetry-proto~=1.45" "numpy>=1.26" "wandb>=0.30" "grpcio>=1.66" "tensorboard>=2.16"
WORKDIR /data
EXPOSE 4317 4318
ENTRYPOINT ["rankscope"]
CMD ["sink", "--host", "0.0.0.0", "--grpc-port", "4317", "--http-port", "4318"]
