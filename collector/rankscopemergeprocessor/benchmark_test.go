package rankscopemergeprocessor

import (
	"fmt"
	"testing"
	"time"

	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/processor/processortest"

	"github.com/rankscope/rankscope/collector/rankscopemergeprocessor/internal/metadata"
)

// benchKeys is what a rank sends per step in the sizing figures (docs/pipeline.md, Sizing).
const benchKeys = 200

// stepRequest is one rank's request for one step as rankscope's SDK sends it: 200 keys, mostly
// MEAN (record_metric's default), some SUM, MAX, MIN and LAST, and its flush marker.
func stepRequest(rank int, step int64) pmetric.Metrics {
	md, ms := request(proc{"trainer", rank}, "exp")
	for k := 0; k < benchKeys; k++ {
		key := fmt.Sprintf("train/key%03d", k)
		switch v := float64(rank + k); k % 20 {
		case 0, 1:
			addNumber(ms, key, "sum", step, v, 5)
		case 2, 3:
			addNumber(ms, key, "max", step, v, 5)
		case 4:
			addNumber(ms, key, "min", step, v, 5)
		case 5:
			addNumber(ms, key, "last", step, v, uint64(5+rank))
		default:
			addMoments(ms, key, "mean", step, []float64{v, v + 1})
		}
	}
	addMarker(ms, step)
	return md
}

// BenchmarkMerge is the processor's merge throughput: per iteration, one step of N ranks ×
// 200 keys taken into a window and the window forwarded (its merged states encoded), on the
// calling goroutine. Receiving and exporting (OTLP decoding, gRPC, the queue) are not in it:
// states/s is what one core merges, an upper bound on what one Collector core carries.
//
//	go test -bench . -run '^$' -cpu 1
func BenchmarkMerge(b *testing.B) {
	for _, ranks := range []int{8, 128, 1024} {
		b.Run(fmt.Sprintf("ranks=%d", ranks), func(b *testing.B) {
			p, err := newMergeProcessor(processortest.NewNopSettings(metadata.Type), &Config{Interval: time.Hour, MaxPoints: 1 << 30}, consumertest.NewNop())
			if err != nil {
				b.Fatal(err)
			}
			step := make([]pmetric.Metrics, ranks)
			for r := range step {
				step[r] = stepRequest(r, 0)
			}
			in := make([]pmetric.Metrics, ranks)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer() // add takes a request apart: each iteration gets fresh copies
				for r := range in {
					in[r] = pmetric.NewMetrics()
					step[r].CopyTo(in[r])
				}
				b.StartTimer()
				for _, md := range in {
					p.mu.Lock()
					p.add(p.win, md)
					p.mu.Unlock()
				}
				p.forward()
			}
			b.ReportMetric(float64(ranks*benchKeys)*float64(b.N)/b.Elapsed().Seconds(), "states/s")
		})
	}
}
