//go:build tools

// Package tools pins telemetrygen (the Collector contrib load generator) for
// scripts/build_pipeline.py, which runs go build on its cmd/telemetrygen.
package tools

import _ "github.com/open-telemetry/opentelemetry-collector-contrib/cmd/telemetrygen"
