package rankscopemergeprocessor

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/sdk/metric/metricdata/metricdatatest"

	"github.com/rankscope/rankscope/collector/rankscopemergeprocessor/internal/metadatatest"
)

// The processor's counters, read from the Collector's own MeterProvider: an agent merges three
// ranks' states and markers and passes their custom reduce types and foreign data on; a gateway
// given the agent's window twice (an upstream queue's retry) merges it once and counts the copy.
func TestCountersSayWhatWasMergedPassedAndDropped(t *testing.T) {
	agentTel, gatewayTel := componenttest.NewTelemetry(), componenttest.NewTelemetry()
	t.Cleanup(func() {
		_ = agentTel.Shutdown(context.Background())
		_ = gatewayTel.Shutdown(context.Background())
	})
	cfg := &Config{Interval: time.Hour, MaxPoints: 1 << 20}

	agent := new(consumertest.MetricsSink)
	a := startWith(t, metadatatest.NewSettings(agentTel), cfg, agent)
	var mds []pmetric.Metrics
	for rank := 0; rank < 3; rank++ {
		md, ms := request(proc{"trainer", rank}, "exp")
		md.ResourceMetrics().At(0).Resource().Attributes().PutInt(attrWorldSize, 3)
		addMoments(ms, "loss", "mean", 0, []float64{1, 2}) // merged
		addNumber(ms, "grad", "max", 0, float64(rank), 5)  // merged
		addNumber(ms, "p50", "p50", 0, 1, 5)               // a custom reduce type: unmerged
		addMarker(ms, 0)                                   // merged into the step's rank set
		mds = append(mds, md)
	}
	consume(t, a, mds...)
	foreign := pmetric.NewMetrics()
	gauge := foreign.ResourceMetrics().AppendEmpty().ScopeMetrics().AppendEmpty().Metrics().AppendEmpty().SetEmptyGauge()
	gauge.DataPoints().AppendEmpty().SetIntValue(1)
	gauge.DataPoints().AppendEmpty().SetIntValue(2)
	if err := a.ConsumeMetrics(context.Background(), foreign); err != nil {
		t.Fatal(err)
	}
	assertCounter(t, agentTel, metadatatest.AssertEqualProcessorRankscopemergeStatesMerged, 9)
	assertCounter(t, agentTel, metadatatest.AssertEqualProcessorRankscopemergePointsUnmerged, 3)
	assertCounter(t, agentTel, metadatatest.AssertEqualProcessorRankscopemergePointsPassedThrough, 2)
	if _, err := agentTel.GetMetric("otelcol_processor_rankscopemerge_windows_duplicate"); err == nil {
		t.Fatal("the agent counted a duplicate window; it was sent none")
	}

	gateway := new(consumertest.MetricsSink)
	g := startWith(t, metadatatest.NewSettings(gatewayTel), cfg, gateway)
	for i := 0; i < 2; i++ {
		copied := pmetric.NewMetrics()
		agent.AllMetrics()[0].CopyTo(copied)
		consume(t, g, copied)
	}
	// The agent's merged resources hold two states (loss and grad at step 0) and a rank set:
	// merged once, the copy's two resources counted as duplicates. The three processes'
	// unmerged points travel again with the copy, for the sink to judge.
	assertCounter(t, gatewayTel, metadatatest.AssertEqualProcessorRankscopemergeStatesMerged, 3)
	assertCounter(t, gatewayTel, metadatatest.AssertEqualProcessorRankscopemergeWindowsDuplicate, 2)
	assertCounter(t, gatewayTel, metadatatest.AssertEqualProcessorRankscopemergePointsUnmerged, 6)
}

func assertCounter(
	t *testing.T, tel *componenttest.Telemetry,
	assert func(*testing.T, *componenttest.Telemetry, []metricdata.DataPoint[int64], ...metricdatatest.Option),
	want int64,
) {
	t.Helper()
	assert(t, tel, []metricdata.DataPoint[int64]{{Value: want}}, metricdatatest.IgnoreTimestamp())
}
