//go:build tools

// Package tools pins Jaeger v2 for scripts/build_pipeline.py, which runs go build on its cmd/jaeger.
// Jaeger v2.13.0 is tagged v1.76.0 for this module path; its go.mod replace is repeated in ours.
package tools

import _ "github.com/jaegertracing/jaeger/cmd/jaeger"
