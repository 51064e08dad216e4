package rankscopemergeprocessor

import (
	"context"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/consumer"
	"go.opentelemetry.io/collector/processor"

	"github.com/rankscope/rankscope/collector/rankscopemergeprocessor/internal/metadata"
)

// NewFactory is the processor's factory, registered in the ocb manifest. Its type and stability
// are metadata.yaml's, through the code mdatagen generates from it.
func NewFactory() processor.Factory {
	return processor.NewFactory(
		metadata.Type,
		func() component.Config { return createDefaultConfig() },
		processor.WithMetrics(createMetrics, metadata.MetricsStability),
	)
}

func createMetrics(
	_ context.Context, set processor.Settings, cfg component.Config, next consumer.Metrics,
) (processor.Metrics, error) {
	p, err := newMergeProcessor(set, cfg.(*Config), next)
	if err != nil {
		return nil, err
	}
	return p, nil
}
