package rankscopemergeprocessor

import (
	"context"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/consumer"
	"go.opentelemetry.io/collector/processor"
)

var componentType = component.MustNewType("rankscopemerge")

// NewFactory is the processor's factory, registered in the ocb manifest.
func NewFactory() processor.Factory {
	return processor.NewFactory(
		componentType,
		func() component.Config { return createDefaultConfig() },
		processor.WithMetrics(createMetrics, component.StabilityLevelDevelopment),
	)
}

func createMetrics(
	_ context.Context, set processor.Settings, cfg component.Config, next consumer.Metrics,
) (processor.Metrics, error) {
	return newMergeProcessor(set, cfg.(*Config), next), nil
}
