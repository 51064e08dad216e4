package rankscopemergeprocessor

import (
	"context"
	"errors"
	"math"
	"math/rand"
	"testing"
	"time"

	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/consumer"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/processor"
	"go.opentelemetry.io/collector/processor/processortest"

	"github.com/rankscope/rankscope/collector/rankscopemergeprocessor/internal/metadata"
)

// -- building requests as rankscope's SDK encodes them -----------------------------------

type proc struct {
	role string
	rank int
}

func request(p proc, experiment string) (pmetric.Metrics, pmetric.MetricSlice) {
	md := pmetric.NewMetrics()
	rm := md.ResourceMetrics().AppendEmpty()
	res := rm.Resource().Attributes()
	res.PutStr(attrExperiment, experiment)
	res.PutStr(attrRole, p.role)
	res.PutInt(attrRank, int64(p.rank))
	res.PutStr(attrInstanceID, p.role+"-"+string(rune('a'+p.rank)))
	sm := rm.ScopeMetrics().AppendEmpty()
	sm.Scope().SetName("rankscope")
	return md, sm.Metrics()
}

func point(attrs pcommon.Map, reduce string, step int64) {
	attrs.PutStr(attrReduce, reduce)
	attrs.PutInt(attrStep, step)
}

func addNumber(ms pmetric.MetricSlice, key, reduce string, step int64, v float64, t uint64) {
	m := ms.AppendEmpty()
	m.SetName(key)
	var dp pmetric.NumberDataPoint
	if reduce == "sum" || reduce == "count" {
		m.SetEmptySum().SetAggregationTemporality(pmetric.AggregationTemporalityDelta)
		dp = m.Sum().DataPoints().AppendEmpty()
	} else {
		dp = m.SetEmptyGauge().DataPoints().AppendEmpty()
	}
	if reduce == "count" {
		dp.SetIntValue(int64(v))
	} else {
		dp.SetDoubleValue(v)
	}
	dp.SetTimestamp(pcommon.Timestamp(t))
	point(dp.Attributes(), reduce, step)
}

func addMoments(ms pmetric.MetricSlice, key, reduce string, step int64, values []float64) {
	m := ms.AppendEmpty()
	m.SetName(key)
	dp := m.SetEmptyHistogram().DataPoints().AppendEmpty()
	var sum, sq float64
	for _, v := range values {
		sum, sq = sum+v, sq+v*v
	}
	dp.SetCount(uint64(len(values)))
	dp.SetSum(sum)
	dp.BucketCounts().Append(uint64(len(values)))
	point(dp.Attributes(), reduce, step)
	if reduce == "std" {
		dp.Attributes().PutDouble(attrSumSq, sq)
	}
}

func addDistribution(ms pmetric.MetricSlice, key string, step int64, scale int32, buckets map[int32]uint64, zeros uint64, lo, hi float64) {
	m := ms.AppendEmpty()
	m.SetName(key)
	dp := m.SetEmptyExponentialHistogram().DataPoints().AppendEmpty()
	total := zeros
	for _, n := range buckets {
		total += n
	}
	dp.SetScale(scale)
	dp.SetCount(total)
	dp.SetZeroCount(zeros)
	dp.SetSum(float64(total))
	dp.SetMin(lo)
	dp.SetMax(hi)
	encodeBuckets(dp.Positive(), buckets)
	point(dp.Attributes(), "distribution", step)
}

func addMarker(ms pmetric.MetricSlice, step int64) {
	m := ms.AppendEmpty()
	m.SetName("rankscope.flush")
	dp := m.SetEmptySum().DataPoints().AppendEmpty()
	dp.SetIntValue(1)
	dp.Attributes().PutInt(attrStep, step)
}

// -- running the processor ---------------------------------------------------------------

func newProcessor(t testing.TB, set processor.Settings, cfg *Config, next consumer.Metrics) *mergeProcessor {
	t.Helper()
	p, err := newMergeProcessor(set, cfg, next)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func start(t *testing.T, cfg *Config, next consumer.Metrics) *mergeProcessor {
	t.Helper()
	return startWith(t, processortest.NewNopSettings(metadata.Type), cfg, next)
}

func startWith(t *testing.T, set processor.Settings, cfg *Config, next consumer.Metrics) *mergeProcessor {
	t.Helper()
	p := newProcessor(t, set, cfg, next)
	if err := p.Start(context.Background(), componenttest.NewNopHost()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Shutdown(context.Background()) })
	return p
}

// consume sends every request at once and forwards them as one window.
func consume(t *testing.T, p *mergeProcessor, mds ...pmetric.Metrics) {
	t.Helper()
	errs := make(chan error, len(mds))
	for _, md := range mds {
		go func() { errs <- p.ConsumeMetrics(context.Background(), md) }()
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		p.mu.Lock()
		n := p.win.requests
		p.mu.Unlock()
		if n == len(mds) {
			break
		}
	}
	p.forward()
	for range mds {
		select {
		case err := <-errs:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a request was not answered")
		}
	}
}

// merged finds the merged point of key at step in what the processor forwarded.
type found struct {
	metric pmetric.Metric
	attrs  pcommon.Map
	index  int
}

func mergedPoints(sink *consumertest.MetricsSink) map[string][]found {
	out := map[string][]found{}
	for _, md := range sink.AllMetrics() {
		rms := md.ResourceMetrics()
		for i := 0; i < rms.Len(); i++ {
			rm := rms.At(i)
			if v, ok := rm.Resource().Attributes().Get(attrMerged); !ok || !v.Bool() {
				continue
			}
			ms := rm.ScopeMetrics().At(0).Metrics()
			for j := 0; j < ms.Len(); j++ {
				m := ms.At(j)
				for k := 0; k < pointCount(m); k++ {
					out[m.Name()] = append(out[m.Name()], found{m, attributesOf(m, k), k})
				}
			}
		}
	}
	return out
}

func attributesOf(m pmetric.Metric, i int) pcommon.Map {
	switch m.Type() {
	case pmetric.MetricTypeSum:
		return m.Sum().DataPoints().At(i).Attributes()
	case pmetric.MetricTypeGauge:
		return m.Gauge().DataPoints().At(i).Attributes()
	case pmetric.MetricTypeHistogram:
		return m.Histogram().DataPoints().At(i).Attributes()
	default:
		return m.ExponentialHistogram().DataPoints().At(i).Attributes()
	}
}

func numberValue(f found) float64 {
	var dp pmetric.NumberDataPoint
	if f.metric.Type() == pmetric.MetricTypeSum {
		dp = f.metric.Sum().DataPoints().At(f.index)
	} else {
		dp = f.metric.Gauge().DataPoints().At(f.index)
	}
	if dp.ValueType() == pmetric.NumberDataPointValueTypeInt {
		return float64(dp.IntValue())
	}
	return dp.DoubleValue()
}

// -- tests -------------------------------------------------------------------------------

// Sixteen processes' states, merged in one window, in a tree of two levels and in windows of
// any split, give exactly what the values give when reduced in one place.
func TestEveryBuiltInReduceMergesExactlyInAnyGrouping(t *testing.T) {
	rng := rand.New(rand.NewSource(7))
	const procs, steps = 16, 3
	type rankValues struct {
		values []float64
		last   float64
		time   uint64
	}
	inputs := make([][]rankValues, steps)
	var requests [][]pmetric.Metrics // per grouping: the same requests, built twice
	for grouping := 0; grouping < 2; grouping++ {
		var mds []pmetric.Metrics
		for r := 0; r < procs; r++ {
			md, ms := request(proc{"trainer", r}, "exp")
			for step := int64(0); step < steps; step++ {
				if grouping == 0 {
					n := 1 + rng.Intn(5)
					vals := make([]float64, n)
					for i := range vals {
						vals[i] = float64(rng.Intn(64)-32) / 4 // dyadic: every sum is exact in any order
					}
					inputs[step] = append(inputs[step], rankValues{vals, vals[n-1], uint64(1000 + rng.Intn(1_000_000))})
				}
				in := inputs[step][r]
				var sum, mx, mn float64 = 0, math.Inf(-1), math.Inf(1)
				for _, v := range in.values {
					sum, mx, mn = sum+v, math.Max(mx, v), math.Min(mn, v)
				}
				addNumber(ms, "sum", "sum", step, sum, 0)
				addNumber(ms, "count", "count", step, float64(len(in.values)), 0)
				addNumber(ms, "max", "max", step, mx, 0)
				addNumber(ms, "min", "min", step, mn, 0)
				addNumber(ms, "last", "last", step, in.last, in.time)
				addMoments(ms, "mean", "mean", step, in.values)
				addMoments(ms, "std", "std", step, in.values)
				addMarker(ms, step)
			}
			mds = append(mds, md)
		}
		requests = append(requests, mds)
	}

	// One level: every process into one processor.
	flat := new(consumertest.MetricsSink)
	consume(t, start(t, &Config{Interval: time.Hour, MaxPoints: 1 << 20}, flat), requests[0]...)

	// Two levels: two agents of 8 processes each, their output into a gateway.
	top := new(consumertest.MetricsSink)
	gateway := start(t, &Config{Interval: time.Hour, MaxPoints: 1 << 20}, top)
	var agentsOut []pmetric.Metrics
	for half := 0; half < 2; half++ {
		agentOut := new(consumertest.MetricsSink)
		consume(t, start(t, &Config{Interval: time.Hour, MaxPoints: 1 << 20}, agentOut), requests[1][half*8:half*8+8]...)
		agentsOut = append(agentsOut, agentOut.AllMetrics()...)
	}
	consume(t, gateway, agentsOut...)

	for name, sink := range map[string]*consumertest.MetricsSink{"flat": flat, "tree": top} {
		got := mergedPoints(sink)
		for step := int64(0); step < steps; step++ {
			var sum, sq float64
			var count, lastTime uint64
			mx, mn, last, argmax, argmin := math.Inf(-1), math.Inf(1), 0.0, -1, -1
			for r, in := range inputs[step] {
				for _, v := range in.values {
					sum, sq, count = sum+v, sq+v*v, count+1
					if v > mx {
						mx, argmax = v, r
					}
					if v < mn {
						mn, argmin = v, r
					}
				}
				if in.time > lastTime {
					last, lastTime = in.last, in.time
				}
			}
			at := func(key string) found {
				t.Helper()
				var hit []found
				for _, f := range got[key] {
					if s, _ := f.attrs.Get(attrStep); s.Int() == step {
						hit = append(hit, f)
					}
				}
				if len(hit) != 1 {
					t.Fatalf("%s: %d merged %s points at step %d, want 1", name, len(hit), key, step)
				}
				return hit[0]
			}
			check := func(key string, got, want float64) {
				t.Helper()
				if got != want {
					t.Errorf("%s step %d %s: got %v, want %v", name, step, key, got, want)
				}
			}
			check("sum", numberValue(at("sum")), sum)
			check("count", numberValue(at("count")), float64(count))
			check("max", numberValue(at("max")), mx)
			check("min", numberValue(at("min")), mn)
			check("last", numberValue(at("last")), last)
			rank, _ := at("max").attrs.Get(attrExtremeRank)
			check("argmax", float64(rank.Int()), float64(argmax))
			rank, _ = at("min").attrs.Get(attrExtremeRank)
			check("argmin", float64(rank.Int()), float64(argmin))
			label, _ := at("max").attrs.Get(attrExtremeLabel)
			if want := "trainer_r" + itoa(argmax); label.Str() != want {
				t.Errorf("%s step %d: extreme label %q, want %q", name, step, label.Str(), want)
			}
			mean := at("mean")
			h := mean.metric.Histogram().DataPoints().At(mean.index)
			check("mean.count", float64(h.Count()), float64(count))
			check("mean.sum", h.Sum(), sum)
			std := at("std")
			sqv, _ := std.attrs.Get(attrSumSq)
			check("std.sum_sq", sqv.Double(), sq)
			// the spread of the processes' own means: their count, mean and extremes with holders
			var means []float64
			for _, in := range inputs[step] {
				total := 0.0
				for _, v := range in.values {
					total += v
				}
				means = append(means, total/float64(len(in.values)))
			}
			n, _ := mean.attrs.Get(attrSpreadN)
			check("spread.n", float64(n.Int()), procs)
			lo, hi, loRank, hiRank, avg := math.Inf(1), math.Inf(-1), -1, -1, 0.0
			for r, v := range means {
				avg += v / procs
				if v < lo {
					lo, loRank = v, r
				}
				if v > hi {
					hi, hiRank = v, r
				}
			}
			m2 := 0.0
			for _, v := range means {
				m2 += (v - avg) * (v - avg)
			}
			for key, want := range map[string]float64{attrSpreadLow: lo, attrSpreadHigh: hi} {
				v, _ := mean.attrs.Get(key)
				check(key, v.Double(), want)
			}
			for key, want := range map[string]int{attrSpreadLowRank: loRank, attrSpreadHighRank: hiRank} {
				v, _ := mean.attrs.Get(key)
				check(key, float64(v.Int()), float64(want))
			}
			for key, want := range map[string]float64{attrSpreadMean: avg, attrSpreadM2: m2} {
				v, _ := mean.attrs.Get(key)
				if math.Abs(v.Double()-want) > 1e-9*math.Max(1, math.Abs(want)) {
					t.Errorf("%s step %d %s: got %v, want %v", name, step, key, v.Double(), want)
				}
			}
			label, _ = mean.attrs.Get(attrSpreadHighLabel)
			if want := "trainer_r" + itoa(hiRank); label.Str() != want {
				t.Errorf("%s step %d: spread high label %q, want %q", name, step, label.Str(), want)
			}
		}
	}
	// 16 processes x 7 keys x 3 steps came in; 7 x 3 states (and the 48 markers) leave.
	if n := top.DataPointCount(); n != 7*steps+procs*steps {
		t.Fatalf("tree: %d points forwarded, want %d", n, 7*steps+procs*steps)
	}
}

func itoa(n int) string { return pcommon.NewValueInt(int64(n)).AsString() }

// Flush markers name the contributors: they pass unmerged, each after the merged data of its
// window, in arrival order.
func TestMarkersAndUnmergeablePointsTravelUnmergedAfterTheMergedStates(t *testing.T) {
	sink := new(consumertest.MetricsSink)
	p := start(t, &Config{Interval: time.Hour, MaxPoints: 1 << 20, PerRankKeys: []string{"loss/*"}}, sink)
	md, ms := request(proc{"trainer", 3}, "exp")
	addNumber(ms, "grad_norm", "max", 5, 2.5, 0)
	addNumber(ms, "loss/policy", "mean", 5, 1, 0) // a Gauge with reduce mean: the sink's edge refuses it
	addMoments(ms, "loss/value", "mean", 5, []float64{1, 2})
	addNumber(ms, "unstepped", "sum", 5, 1, 0)
	ms.At(ms.Len() - 1).Sum().DataPoints().At(0).Attributes().Remove(attrStep)
	addNumber(ms, "custom", "topk", 5, 1, 0)
	addNumber(ms, "weird", "max", 5, 1, 0)
	ms.At(ms.Len()-1).Gauge().DataPoints().At(0).Attributes().PutStr(attrStateField, "x")
	addMarker(ms, 5)
	errs := make(chan error, 1)
	go func() { errs <- p.ConsumeMetrics(context.Background(), md) }()
	select {
	case <-errs:
		t.Fatal("answered before its window was forwarded")
	case <-time.After(100 * time.Millisecond):
	}
	p.forward()
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	out := sink.AllMetrics()[0].ResourceMetrics()
	if out.Len() != 2 {
		t.Fatalf("%d resources forwarded, want the merged one then the process's own", out.Len())
	}
	if v, _ := out.At(0).Resource().Attributes().Get(attrMerged); !v.Bool() {
		t.Fatal("merged states must come first")
	}
	var names []string
	own := out.At(1).ScopeMetrics().At(0).Metrics()
	for i := 0; i < own.Len(); i++ {
		names = append(names, own.At(i).Name())
	}
	want := []string{"loss/policy", "loss/value", "unstepped", "custom", "weird", "rankscope.flush"}
	if len(names) != len(want) {
		t.Fatalf("unmerged: %v, want %v", names, want)
	}
	for i := range want {
		if names[i] != want[i] {
			t.Fatalf("unmerged: %v, want %v", names, want)
		}
	}
	if rank, _ := out.At(1).Resource().Attributes().Get(attrRank); rank.Int() != 3 {
		t.Fatal("the unmerged part keeps its process's resource")
	}
}

// Distributions merge bucket-wise, a finer state downscaled exactly to the coarser one.
func TestDistributionsMergeBucketWiseAcrossScales(t *testing.T) {
	sink := new(consumertest.MetricsSink)
	p := start(t, &Config{Interval: time.Hour, MaxPoints: 1 << 20}, sink)
	a, ams := request(proc{"trainer", 0}, "exp")
	addDistribution(ams, "lat", 1, 7, map[int32]uint64{10: 2, 11: 3, -4: 1}, 1, 0, 9)
	b, bms := request(proc{"trainer", 1}, "exp")
	addDistribution(bms, "lat", 1, 6, map[int32]uint64{5: 4, 6: 1}, 2, -1, 12)
	consume(t, p, a, b)
	f := mergedPoints(sink)["lat"][0]
	dp := f.metric.ExponentialHistogram().DataPoints().At(f.index)
	if dp.Scale() != 6 || dp.Count() != 14 || dp.ZeroCount() != 3 || dp.Min() != -1 || dp.Max() != 12 {
		t.Fatalf("scale %d count %d zeros %d min %v max %v", dp.Scale(), dp.Count(), dp.ZeroCount(), dp.Min(), dp.Max())
	}
	got := map[int32]uint64{}
	for i := 0; i < dp.Positive().BucketCounts().Len(); i++ {
		if n := dp.Positive().BucketCounts().At(i); n > 0 {
			got[dp.Positive().Offset()+int32(i)] = n
		}
	}
	want := map[int32]uint64{5: 2 + 4, 6: 1, -2: 1} // 10,11 -> 5; 11>>1 = 5; -4>>1 = -2
	want[5] = 2 + 3 + 4
	if len(got) != len(want) {
		t.Fatalf("buckets %v, want %v", got, want)
	}
	for k, n := range want {
		if got[k] != n {
			t.Fatalf("buckets %v, want %v", got, want)
		}
	}
}

// The lowest rank holds a tied extreme, as on the sink's direct path; NaN wins a max.
func TestExtremeTiesGoToTheLowestRankAndNaNWins(t *testing.T) {
	sink := new(consumertest.MetricsSink)
	p := start(t, &Config{Interval: time.Hour, MaxPoints: 1 << 20}, sink)
	var mds []pmetric.Metrics
	for _, r := range []int{5, 2, 9} {
		md, ms := request(proc{"gen", r}, "exp")
		addNumber(ms, "tie", "max", 0, 4, 0)
		v := 1.0
		if r == 9 {
			v = math.NaN()
		}
		addNumber(ms, "nan", "max", 0, v, 0)
		mds = append(mds, md)
	}
	consume(t, p, mds...)
	got := mergedPoints(sink)
	if rank, _ := got["tie"][0].attrs.Get(attrExtremeRank); rank.Int() != 2 {
		t.Fatalf("tie held by rank %d, want 2", rank.Int())
	}
	if v := numberValue(got["nan"][0]); !math.IsNaN(v) {
		t.Fatalf("max with a NaN gave %v", v)
	}
}

// A failing next stage fails every request of the window: the senders keep their data and retry.
func TestADownstreamFailureIsAnsweredToEverySender(t *testing.T) {
	failing := consumertest.NewErr(errors.New("queue full"))
	p := start(t, &Config{Interval: 20 * time.Millisecond, MaxPoints: 1 << 20}, failing)
	md, ms := request(proc{"trainer", 0}, "exp")
	addNumber(ms, "x", "sum", 0, 1, 0)
	if err := p.ConsumeMetrics(context.Background(), md); err == nil || err.Error() != "queue full" {
		t.Fatalf("got %v", err)
	}
}

// Plain OTel data (no experiment) is not held; a full window is forwarded at once.
func TestForeignDataPassesAtOnceAndAFullWindowLeavesEarly(t *testing.T) {
	sink := new(consumertest.MetricsSink)
	p := start(t, &Config{Interval: time.Hour, MaxPoints: 2}, sink)
	plain := pmetric.NewMetrics()
	m := plain.ResourceMetrics().AppendEmpty().ScopeMetrics().AppendEmpty().Metrics().AppendEmpty()
	m.SetName("http.server.duration")
	m.SetEmptyGauge().DataPoints().AppendEmpty().SetIntValue(3)
	if err := p.ConsumeMetrics(context.Background(), plain); err != nil || sink.DataPointCount() != 1 {
		t.Fatalf("err %v, %d points forwarded", err, sink.DataPointCount())
	}
	md, ms := request(proc{"trainer", 0}, "exp")
	addNumber(ms, "a", "sum", 0, 1, 0)
	addNumber(ms, "b", "sum", 0, 1, 0)
	if err := p.ConsumeMetrics(context.Background(), md); err != nil { // MaxPoints 2: not an hour's wait
		t.Fatal(err)
	}
}

// Hostile requests never make the processor panic: every decoded protobuf is taken or passed on.
func FuzzConsumeNeverPanics(f *testing.F) {
	md, ms := request(proc{"trainer", 1}, "exp")
	addNumber(ms, "s", "sum", 1, 2, 0)
	addNumber(ms, "m", "max", 1, 2, 0)
	addMoments(ms, "std", "std", 1, []float64{1, 2})
	addDistribution(ms, "d", 1, 6, map[int32]uint64{-3: 1, 4: 2}, 0, 1, 2)
	addMarker(ms, 1)
	seed, _ := (&pmetric.ProtoMarshaler{}).MarshalMetrics(md)
	f.Add(seed)
	f.Add(seed[:len(seed)/2])
	ranked := rankRequest("trainer", "0", 3, 8, 1, 2) // markers that merge into rank sets
	window := ranked.ResourceMetrics().AppendEmpty()  // and an upstream merger's rank set
	window.Resource().Attributes().PutStr(attrExperiment, "exp")
	window.Resource().Attributes().PutBool(attrMerged, true)
	sets := window.ScopeMetrics().AppendEmpty().Metrics().AppendEmpty()
	sets.SetName(metricRanks)
	dp := sets.SetEmptySum().DataPoints().AppendEmpty()
	dp.Attributes().PutInt(attrStep, 1)
	dp.Attributes().PutStr(attrRole, "trainer")
	dp.Attributes().PutInt(attrWorldSize, 8)
	dp.Attributes().PutStr(attrRanks, "0-2,4-7")
	seed, _ = (&pmetric.ProtoMarshaler{}).MarshalMetrics(ranked)
	f.Add(seed)
	f.Fuzz(func(t *testing.T, data []byte) {
		in, err := (&pmetric.ProtoUnmarshaler{}).UnmarshalMetrics(data)
		if err != nil {
			return
		}
		sink := new(consumertest.MetricsSink)
		p := newProcessor(t, processortest.NewNopSettings(metadata.Type), &Config{Interval: time.Hour, MaxPoints: 1 << 20}, sink)
		p.mu.Lock()
		p.add(p.win, in)
		p.mu.Unlock()
		p.forward()
	})
}

func TestConfigValidation(t *testing.T) {
	if err := createDefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	bad := &Config{Interval: 0, MaxPoints: 0, PerRankKeys: []string{""}}
	if err := bad.Validate(); err == nil {
		t.Fatal("a zero interval, no room and an empty pattern must be refused")
	}
	re := (&Config{PerRankKeys: []string{"loss/*", "lr?"}}).keyMatcher()
	for key, want := range map[string]bool{"loss/policy/kl": true, "lr1": true, "lr": false, "xloss/a": false, "a.b": false} {
		if re.MatchString(key) != want {
			t.Errorf("per_rank_keys match %q: got %v", key, !want)
		}
	}
}

// Two windows that merge to the same states are two deliveries, not a retry of one: the sink
// recognizes retries by content, so each merged resource carries its window's number.
func TestIdenticalWindowsAreDistinguishable(t *testing.T) {
	sink := new(consumertest.MetricsSink)
	p := start(t, &Config{Interval: time.Hour, MaxPoints: 1 << 20}, sink)
	for i := 0; i < 2; i++ {
		md, ms := request(proc{"trainer", 0}, "exp")
		addNumber(ms, "x", "sum", 0, 1, 5)
		consume(t, p, md)
	}
	first, second := sink.AllMetrics()[0], sink.AllMetrics()[1]
	a, _ := first.ResourceMetrics().At(0).Resource().Attributes().Get(attrWindow)
	b, _ := second.ResourceMetrics().At(0).Resource().Attributes().Get(attrWindow)
	if a.Int() == b.Int() {
		t.Fatalf("both windows numbered %d", a.Int())
	}
}

// An upstream merger's persistent queue sends a window again when it died before the answer:
// that copy is answered and not merged twice. One whose first delivery failed is taken.
func TestAnUpstreamWindowSentAgainIsTakenOnce(t *testing.T) {
	agent := new(consumertest.MetricsSink)
	a := start(t, &Config{Interval: time.Hour, MaxPoints: 1 << 20}, agent)
	md, ms := request(proc{"trainer", 0}, "exp")
	addNumber(ms, "x", "sum", 0, 7, 5)
	other, ms2 := request(proc{"trainer", 0}, "another") // one window, two experiments: two resources
	addNumber(ms2, "x", "sum", 0, 7, 5)
	other.ResourceMetrics().MoveAndAppendTo(md.ResourceMetrics())
	consume(t, a, md)
	window := agent.AllMetrics()[0]

	gateway := new(consumertest.MetricsSink)
	g := start(t, &Config{Interval: time.Hour, MaxPoints: 1 << 20}, gateway)
	for i := 0; i < 3; i++ {
		copied := pmetric.NewMetrics()
		window.CopyTo(copied)
		consume(t, g, copied)
	}
	total := 0.0
	for _, out := range gateway.AllMetrics() {
		rms := out.ResourceMetrics()
		for i := 0; i < rms.Len(); i++ {
			metrics := rms.At(i).ScopeMetrics().At(0).Metrics()
			for j := 0; j < metrics.Len(); j++ {
				if metrics.At(j).Name() == "x" {
					total += metrics.At(j).Sum().DataPoints().At(0).DoubleValue()
				}
			}
		}
	}
	if total != 14 {
		t.Fatalf("the gateway forwarded x = %v for one window of two experiments (7 each) sent three times", total)
	}

	failing := consumertest.NewErr(errors.New("queue full"))
	f := start(t, &Config{Interval: 20 * time.Millisecond, MaxPoints: 1 << 20}, failing)
	copied := pmetric.NewMetrics()
	window.CopyTo(copied)
	if err := f.ConsumeMetrics(context.Background(), copied); err == nil {
		t.Fatal("a failed delivery was answered as taken")
	}
	if len(f.taken) != 0 {
		t.Fatalf("a window whose delivery failed was remembered: %v", f.taken)
	}
}

// Two launches of one experiment (two runs) are never merged into each other: each leaves as
// its own resource, carrying its run (and the run a resuming launch continues).
func TestRunsOfOneExperimentMergeApart(t *testing.T) {
	sink := new(consumertest.MetricsSink)
	p := start(t, &Config{Interval: time.Hour, MaxPoints: 1 << 20}, sink)
	var mds []pmetric.Metrics
	for i, run := range []string{"first", "second", "first"} {
		md, ms := request(proc{"trainer", i}, "exp")
		md.ResourceMetrics().At(0).Resource().Attributes().PutStr(attrRun, run)
		if run == "second" {
			md.ResourceMetrics().At(0).Resource().Attributes().PutStr(attrResume, "latest")
		}
		addNumber(ms, "x", "sum", 0, float64(i+1), 5)
		mds = append(mds, md)
	}
	consume(t, p, mds...)
	sums := map[string]float64{}
	resumes := map[string]string{}
	for _, md := range sink.AllMetrics() {
		rms := md.ResourceMetrics()
		for i := 0; i < rms.Len(); i++ {
			res := rms.At(i).Resource().Attributes()
			if v, ok := res.Get(attrMerged); !ok || !v.Bool() {
				continue
			}
			run, _ := res.Get(attrRun)
			if r, ok := res.Get(attrResume); ok {
				resumes[run.Str()] = r.Str()
			}
			m := rms.At(i).ScopeMetrics().At(0).Metrics().At(0)
			sums[run.Str()] += numberValue(found{m, attributesOf(m, 0), 0})
		}
	}
	if sums["first"] != 4 || sums["second"] != 2 || len(sums) != 2 {
		t.Fatalf("runs merged as %v, want first 4 (1+3) and second 2", sums)
	}
	if resumes["second"] != "latest" || resumes["first"] != "" {
		t.Fatalf("resume carried as %v", resumes)
	}
}

// A part merged upstream without a spread (an older Collector) makes the key's spread unknown: no
// spread leaves rather than one that counts that part as a single process; a malformed one likewise.
func TestASpreadWithAnUnknownPartIsNotSent(t *testing.T) {
	for _, carried := range []string{"none", "malformed"} {
		md, ms := request(proc{"trainer", 0}, "exp")
		addMoments(ms, "loss", "mean", 0, []float64{1, 2})
		upstream, ums := request(proc{"trainer", 1}, "exp")
		upstream.ResourceMetrics().At(0).Resource().Attributes().PutBool(attrMerged, true)
		addMoments(ums, "loss", "mean", 0, []float64{3, 4, 5})
		if carried == "malformed" {
			dp := ums.At(0).Histogram().DataPoints().At(0)
			dp.Attributes().PutInt(attrSpreadN, 3)
			dp.Attributes().PutStr(attrSpreadMean, "not a number")
		}
		out := new(consumertest.MetricsSink)
		consume(t, start(t, &Config{Interval: time.Hour, MaxPoints: 1 << 20}, out), md, upstream)
		got := mergedPoints(out)["loss"]
		if len(got) != 1 {
			t.Fatalf("%s: %d merged loss points, want 1", carried, len(got))
		}
		if _, ok := got[0].attrs.Get(attrSpreadN); ok {
			t.Errorf("%s: a spread was sent though a part of it is not known", carried)
		}
		if h := got[0].metric.Histogram().DataPoints().At(got[0].index); h.Count() != 5 || h.Sum() != 15 {
			t.Errorf("%s: the mean itself must still merge: count %d sum %v", carried, h.Count(), h.Sum())
		}
	}
}

// A process without samples, or whose value is not finite, is not in the spread.
func TestASpreadLeavesOutProcessesWithoutAFiniteValue(t *testing.T) {
	var mds []pmetric.Metrics
	for r, values := range [][]float64{{1}, {2}, {}, {math.NaN()}} {
		md, ms := request(proc{"trainer", r}, "exp")
		addMoments(ms, "loss", "mean", 0, values)
		mds = append(mds, md)
	}
	out := new(consumertest.MetricsSink)
	consume(t, start(t, &Config{Interval: time.Hour, MaxPoints: 1 << 20}, out), mds...)
	got := mergedPoints(out)["loss"][0]
	if n, _ := got.attrs.Get(attrSpreadN); n.Int() != 2 {
		t.Errorf("spread.n %d, want 2", n.Int())
	}
}
