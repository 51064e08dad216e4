package rankscopemergeprocessor

import (
	"math"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pmetric"
)

// The wire names, as rankscope's Python package defines them (rankscope/core/names.py; the
// numbers: rankscope/otlp/metrics.py). A rename there is a wire-format change here too, and
// tests/unit/test_wire_names.py reads both files and holds them equal.
const (
	attrExperiment      = "rankscope.experiment.id"
	attrAttempt         = "rankscope.experiment.attempt"
	attrRun             = "rankscope.run.id"
	attrResume          = "rankscope.run.resume"
	attrRole            = "rankscope.role"
	attrReplica         = "rankscope.replica"
	attrRank            = "rankscope.rank"
	attrReduce          = "rankscope.reduce"
	attrStep            = "rankscope.step"
	attrStateField      = "rankscope.state"
	attrSumSq           = "rankscope.sum_sq"
	attrExtremeRank     = "rankscope.extreme.rank"
	attrExtremeLabel    = "rankscope.extreme.label"
	attrSpreadN         = "rankscope.spread.n" // the spread of the processes' own values (spread.go)
	attrSpreadMean      = "rankscope.spread.mean"
	attrSpreadM2        = "rankscope.spread.m2"
	attrSpreadLow       = "rankscope.spread.low"
	attrSpreadLowRank   = "rankscope.spread.low.rank"
	attrSpreadLowLabel  = "rankscope.spread.low.label"
	attrSpreadHigh      = "rankscope.spread.high"
	attrSpreadHighRank  = "rankscope.spread.high.rank"
	attrSpreadHighLabel = "rankscope.spread.high.label"
	attrMerged          = "rankscope.merged"
	attrWindow          = "rankscope.merge.window"
	attrServiceName     = "service.name"
	attrInstanceID      = "service.instance.id"
	attrHostName        = "host.name"
	attrWorldSize       = "rankscope.world_size"
	attrRanks           = "rankscope.ranks"      // a merged marker's ranks (markers.go)
	attrMergePart       = "rankscope.merge.part" // "ranks" on the resource of a window's merged markers
	attrFallback        = "rankscope.experiment.attempt_fallback"
	metricFlush         = "rankscope.flush"
	metricRanks         = "rankscope.flush.ranks"
	maxWorldSize        = 1_048_576 // a rank set's group at most, as the sink's edge (otlp/markers.py)
	maxSpans            = 65_536    // ranges in one rank-set point at most, likewise
	distributionScale   = 6         // the scale rankscope's SDK encodes distributions at
	maxScale            = 20        // as the sink: finer scales are refused there
	maxBuckets          = 16_384
	maxNameBytes        = 255
	maxLabelBytes       = 512
)

type reduceKind uint8

const (
	reduceSum reduceKind = iota
	reduceCount
	reduceMax
	reduceMin
	reduceLast
	reduceMean
	reduceStd
	reduceDistribution
)

var reduceKinds = map[string]reduceKind{
	"sum": reduceSum, "count": reduceCount, "max": reduceMax, "min": reduceMin, "last": reduceLast,
	"mean": reduceMean, "std": reduceStd, "distribution": reduceDistribution,
}

// The OTel point type each reduce type travels as (the table in rankscope/otlp/metrics.py).
var pointType = [...]pmetric.MetricType{
	reduceSum: pmetric.MetricTypeSum, reduceCount: pmetric.MetricTypeSum,
	reduceMax: pmetric.MetricTypeGauge, reduceMin: pmetric.MetricTypeGauge, reduceLast: pmetric.MetricTypeGauge,
	reduceMean: pmetric.MetricTypeHistogram, reduceStd: pmetric.MetricTypeHistogram,
	reduceDistribution: pmetric.MetricTypeExponentialHistogram,
}

// number is a NumberDataPoint's value, kept as sent: ints stay ints while they fit.
type number struct {
	isInt bool
	i     int64
	f     float64
}

func (n number) float() float64 {
	if n.isInt {
		return float64(n.i)
	}
	return n.f
}

func (n number) add(o number) number {
	if n.isInt && o.isInt {
		if s := n.i + o.i; (s > n.i) == (o.i > 0) { // no overflow
			return number{isInt: true, i: s}
		}
	}
	return number{f: n.float() + o.float()}
}

// state is one reduce state: what one process sent for one key and step, or several merged.
type state struct {
	kind  reduceKind
	unit  string
	start pcommon.Timestamp
	time  pcommon.Timestamp

	value number // sum, count, max, min, last

	count uint64  // mean, std, distribution
	sum   float64 // mean, std, distribution
	sumSq float64 // std

	holderRank  int64 // max, min: who holds the extreme
	holderLabel string

	spread spread // sum, mean, std: the processes' own values (spread.go)

	scale          int32 // distribution
	zeroCount      uint64
	min, max       float64
	positive       map[int32]uint64
	negative       map[int32]uint64
	hasMin, hasMax bool
}

// holder is the process a state came from, for the extreme's rank and label; merged: a
// Collector's merged resource (its states hold many processes).
type holder struct {
	rank   int64
	label  string
	merged bool
}

// decodeNumber, decodeHistogram and decodeExponential return the state a rankscope point
// holds, or false when this processor does not merge it (it then travels on unmerged, and
// the sink's edge judges it). They never panic on what a client sent.
func decodeNumber(kind reduceKind, dp pmetric.NumberDataPoint, from *holder) (*state, bool) {
	if _, custom := dp.Attributes().Get(attrStateField); custom {
		return nil, false
	}
	s := &state{kind: kind, start: dp.StartTimestamp(), time: dp.Timestamp()}
	switch dp.ValueType() {
	case pmetric.NumberDataPointValueTypeInt:
		s.value = number{isInt: true, i: dp.IntValue()}
	case pmetric.NumberDataPointValueTypeDouble:
		s.value = number{f: dp.DoubleValue()}
	default:
		return nil, false
	}
	if kind == reduceCount && !(s.value.isInt && s.value.i >= 0) {
		return nil, false
	}
	if kind == reduceSum {
		s.spreadFrom(dp.Attributes(), from)
	}
	if kind == reduceMax || kind == reduceMin {
		s.holderRank, s.holderLabel = from.rank, from.label
		if r, ok := nonNegativeInt(dp.Attributes(), attrExtremeRank); ok { // merged upstream
			s.holderRank, s.holderLabel = r, ""
			if l, ok := dp.Attributes().Get(attrExtremeLabel); ok && l.Type() == pcommon.ValueTypeStr {
				s.holderLabel = truncate(l.Str(), maxLabelBytes)
			}
		}
	}
	return s, true
}

// spreadFrom sets the state's spread: the one a merged point carries, else the process's own
// value (a process's point carries none: only a merged resource's attributes are read).
func (s *state) spreadFrom(attrs pcommon.Map, from *holder) {
	if from.merged {
		s.spread, _ = decodeSpread(attrs) // none or malformed: not known
		return
	}
	v, ok := s.processValue()
	s.spread = own(v, ok, from)
}

func decodeHistogram(kind reduceKind, dp pmetric.HistogramDataPoint, from *holder) (*state, bool) {
	if !dp.HasSum() && dp.Count() > 0 {
		return nil, false
	}
	s := &state{kind: kind, count: dp.Count(), sum: dp.Sum(), start: dp.StartTimestamp(), time: dp.Timestamp()}
	if kind == reduceStd {
		v, ok := dp.Attributes().Get(attrSumSq)
		switch {
		case ok && v.Type() == pcommon.ValueTypeDouble:
			s.sumSq = v.Double()
		case ok && v.Type() == pcommon.ValueTypeInt:
			s.sumSq = float64(v.Int())
		default:
			return nil, false
		}
	}
	s.spreadFrom(dp.Attributes(), from)
	return s, true
}

func decodeExponential(dp pmetric.ExponentialHistogramDataPoint) (*state, bool) {
	if dp.Scale() < distributionScale || dp.Scale() > maxScale {
		return nil, false
	}
	s := &state{
		kind: reduceDistribution, scale: dp.Scale(), count: dp.Count(), sum: dp.Sum(), zeroCount: dp.ZeroCount(),
		min: dp.Min(), max: dp.Max(), hasMin: dp.HasMin(), hasMax: dp.HasMax(),
		start: dp.StartTimestamp(), time: dp.Timestamp(),
	}
	total := s.zeroCount
	var ok bool
	if s.positive, total, ok = decodeBuckets(dp.Positive(), total); !ok {
		return nil, false
	}
	if s.negative, total, ok = decodeBuckets(dp.Negative(), total); !ok {
		return nil, false
	}
	return s, total <= s.count
}

func decodeBuckets(b pmetric.ExponentialHistogramDataPointBuckets, total uint64) (map[int32]uint64, uint64, bool) {
	counts := b.BucketCounts()
	if counts.Len() > maxBuckets || int64(b.Offset())+int64(counts.Len()) > math.MaxInt32 {
		return nil, 0, false
	}
	out := make(map[int32]uint64, counts.Len())
	for j := 0; j < counts.Len(); j++ {
		n := counts.At(j)
		if n == 0 {
			continue
		}
		if total+n < total {
			return nil, 0, false
		}
		total += n
		out[b.Offset()+int32(j)] = n
	}
	return out, total, true
}

// merge folds o into s exactly: the result is what rankscope's reduce types compute from
// both states (rankscope/metrics/reduce.py).
func (s *state) merge(o *state) {
	if o.start != 0 && (s.start == 0 || o.start < s.start) {
		s.start = o.start
	}
	switch s.kind {
	case reduceSum, reduceCount:
		s.value = s.value.add(o.value)
		if s.kind == reduceSum {
			s.spread.merge(o.spread)
		}
	case reduceMax, reduceMin:
		a, b := s.value.float(), o.value.float()
		better := b > a || (b == a && o.holderRank < s.holderRank) // the lowest rank on a tie
		if s.kind == reduceMin {
			better = b < a || (b == a && o.holderRank < s.holderRank)
		}
		if math.IsNaN(a) {
			better = false // NaN wins, as in the sink
		} else if math.IsNaN(b) {
			better = true
		}
		if better {
			s.value, s.holderRank, s.holderLabel = o.value, o.holderRank, o.holderLabel
		}
	case reduceLast:
		if o.time > s.time {
			s.value, s.time = o.value, o.time
		}
		return
	case reduceMean, reduceStd:
		s.count += o.count
		s.sum += o.sum
		s.sumSq += o.sumSq
		s.spread.merge(o.spread)
	case reduceDistribution:
		s.mergeDistribution(o)
	}
	if o.time > s.time {
		s.time = o.time
	}
}

func (s *state) mergeDistribution(o *state) {
	if o.scale < s.scale {
		s.positive, s.negative = downscale(s.positive, s.scale-o.scale), downscale(s.negative, s.scale-o.scale)
		s.scale = o.scale
	}
	shift := o.scale - s.scale
	for _, side := range [2][2]map[int32]uint64{{s.positive, o.positive}, {s.negative, o.negative}} {
		for index, n := range side[1] {
			side[0][index>>shift] += n
		}
	}
	s.count += o.count
	s.sum += o.sum
	s.zeroCount += o.zeroCount
	s.min, s.hasMin = mergeBound(s.min, s.hasMin, o.min, o.hasMin, math.Min)
	s.max, s.hasMax = mergeBound(s.max, s.hasMax, o.max, o.hasMax, math.Max)
}

func downscale(buckets map[int32]uint64, by int32) map[int32]uint64 {
	out := make(map[int32]uint64, len(buckets))
	for index, n := range buckets {
		out[index>>by] += n
	}
	return out
}

// mergeBound keeps NaN (math.Min/Max propagate it) and ignores a side that has no bound.
func mergeBound(a float64, hasA bool, b float64, hasB bool, pick func(float64, float64) float64) (float64, bool) {
	switch {
	case hasA && hasB:
		return pick(a, b), true
	case hasB:
		return b, true
	default:
		return a, hasA
	}
}

// encode appends the state as one data point of m (created with the reduce type's point type).
func (s *state) encode(m pmetric.Metric, reduce string, step int64) {
	var attrs pcommon.Map
	switch s.kind {
	case reduceSum, reduceCount, reduceMax, reduceMin, reduceLast:
		var dp pmetric.NumberDataPoint
		if s.kind <= reduceCount {
			dp = m.Sum().DataPoints().AppendEmpty()
		} else {
			dp = m.Gauge().DataPoints().AppendEmpty()
		}
		if s.value.isInt {
			dp.SetIntValue(s.value.i)
		} else {
			dp.SetDoubleValue(s.value.f)
		}
		dp.SetStartTimestamp(s.start)
		dp.SetTimestamp(s.time)
		attrs = dp.Attributes()
	case reduceMean, reduceStd:
		dp := m.Histogram().DataPoints().AppendEmpty()
		dp.SetCount(s.count)
		dp.SetSum(s.sum)
		dp.BucketCounts().Append(s.count)
		dp.SetStartTimestamp(s.start)
		dp.SetTimestamp(s.time)
		attrs = dp.Attributes()
	case reduceDistribution:
		dp := m.ExponentialHistogram().DataPoints().AppendEmpty()
		dp.SetScale(s.scale)
		dp.SetCount(s.count)
		dp.SetSum(s.sum)
		dp.SetZeroCount(s.zeroCount)
		if s.hasMin {
			dp.SetMin(s.min)
		}
		if s.hasMax {
			dp.SetMax(s.max)
		}
		encodeBuckets(dp.Positive(), s.positive)
		encodeBuckets(dp.Negative(), s.negative)
		dp.SetStartTimestamp(s.start)
		dp.SetTimestamp(s.time)
		attrs = dp.Attributes()
	}
	attrs.PutStr(attrReduce, reduce)
	attrs.PutInt(attrStep, step)
	if s.kind == reduceStd {
		attrs.PutDouble(attrSumSq, s.sumSq)
	}
	if s.kind == reduceSum || s.kind == reduceMean || s.kind == reduceStd {
		s.spread.encode(attrs)
	}
	if s.kind == reduceMax || s.kind == reduceMin {
		attrs.PutInt(attrExtremeRank, s.holderRank)
		if s.holderLabel != "" {
			attrs.PutStr(attrExtremeLabel, s.holderLabel)
		}
	}
}

func encodeBuckets(b pmetric.ExponentialHistogramDataPointBuckets, buckets map[int32]uint64) {
	if len(buckets) == 0 {
		return
	}
	lo, hi := int32(math.MaxInt32), int32(math.MinInt32)
	for index := range buckets {
		lo, hi = min(lo, index), max(hi, index)
	}
	counts := make([]uint64, int64(hi)-int64(lo)+1)
	for index, n := range buckets {
		counts[index-lo] = n
	}
	b.SetOffset(lo)
	b.BucketCounts().FromRaw(counts)
}

// newMetric appends a metric of the point type the reduce type travels as.
func newMetric(metrics pmetric.MetricSlice, key, unit string, kind reduceKind) pmetric.Metric {
	metric := metrics.AppendEmpty()
	metric.SetName(key)
	metric.SetUnit(unit)
	switch pointType[kind] {
	case pmetric.MetricTypeSum:
		sum := metric.SetEmptySum()
		sum.SetAggregationTemporality(pmetric.AggregationTemporalityDelta)
		sum.SetIsMonotonic(kind == reduceCount)
	case pmetric.MetricTypeGauge:
		metric.SetEmptyGauge()
	case pmetric.MetricTypeHistogram:
		metric.SetEmptyHistogram().SetAggregationTemporality(pmetric.AggregationTemporalityDelta)
	default:
		metric.SetEmptyExponentialHistogram().SetAggregationTemporality(pmetric.AggregationTemporalityDelta)
	}
	return metric
}

// -- attributes ------------------------------------------------------------------------

// nonNegativeInt reads an int attribute, or a string of digits (ranks arrive as either).
func nonNegativeInt(attrs pcommon.Map, key string) (int64, bool) {
	v, ok := attrs.Get(key)
	if !ok {
		return 0, false
	}
	switch v.Type() {
	case pcommon.ValueTypeInt:
		return v.Int(), v.Int() >= 0
	case pcommon.ValueTypeStr:
		n, err := strconv.ParseInt(v.Str(), 10, 64)
		return n, err == nil && n >= 0
	default:
		return 0, false
	}
}

// cleanName is a key the sink would take: 1 to 255 bytes of UTF-8 with no control characters.
func cleanName(name string) bool {
	if name == "" || len(name) > maxNameBytes || !utf8.ValidString(name) {
		return false
	}
	return strings.IndexFunc(name, func(r rune) bool { return unicode.IsControl(r) || unicode.Is(unicode.Cf, r) }) < 0
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "")
}
