package rankscopemergeprocessor

import (
	"math"

	"go.opentelemetry.io/collector/pdata/pcommon"
)

// spread is the spread of the processes' own values of a MEAN, SUM or STD key
// (rankscope/sink/book/spread.py): how many processes, their mean and sum of squared deviations
// (Chan's merge), and the lowest and highest value with the process that holds it. A merged
// point carries it as attributes (attrSpread*), so the sink can tell the process whose value is
// far from the others' through any tree of Collectors.
// !known: a part came merged by a Collector that sent no spread (an older one), so the whole is
// not known (that wins every merge).
type spread struct {
	known         bool
	n             int64
	mean, m2      float64
	low, high     float64
	lowBy, highBy *holder // shared: the resource's, or a merged point's own
}

// own is one process's value as its spread (an empty one when it has none: no samples, not finite).
func own(v float64, ok bool, from *holder) spread {
	if !ok || math.IsNaN(v) || math.IsInf(v, 0) {
		return spread{known: true}
	}
	return spread{known: true, n: 1, mean: v, low: v, high: v, lowBy: from, highBy: from}
}

// processValue is what the process's state says of its own value: its sum, mean or standard deviation.
func (s *state) processValue() (float64, bool) {
	switch s.kind {
	case reduceSum:
		return s.value.float(), true
	case reduceMean, reduceStd:
		if s.count == 0 {
			return 0, false
		}
		mean := s.sum / float64(s.count)
		if s.kind == reduceMean {
			return mean, true
		}
		return math.Sqrt(math.Max(0, s.sumSq/float64(s.count)-mean*mean)), true
	}
	return 0, false
}

// decodeSpread reads a merged point's spread; false when it carries none or a malformed one.
func decodeSpread(attrs pcommon.Map) (spread, bool) {
	n, ok := nonNegativeInt(attrs, attrSpreadN)
	if !ok {
		return spread{}, false
	}
	out := spread{known: true, n: n}
	if n == 0 {
		return out, true
	}
	floats := [...]*float64{&out.mean, &out.m2, &out.low, &out.high}
	for i, key := range [...]string{attrSpreadMean, attrSpreadM2, attrSpreadLow, attrSpreadHigh} {
		v, ok := attrs.Get(key)
		if !ok || v.Type() != pcommon.ValueTypeDouble || math.IsNaN(v.Double()) || math.IsInf(v.Double(), 0) {
			return spread{}, false
		}
		*floats[i] = v.Double()
	}
	if out.m2 < 0 || out.low > out.high {
		return spread{}, false
	}
	for _, side := range [...]struct {
		rank, label string
		by          **holder
	}{{attrSpreadLowRank, attrSpreadLowLabel, &out.lowBy}, {attrSpreadHighRank, attrSpreadHighLabel, &out.highBy}} {
		r, ok := nonNegativeInt(attrs, side.rank)
		if !ok {
			return spread{}, false
		}
		by := &holder{rank: r}
		if l, ok := attrs.Get(side.label); ok && l.Type() == pcommon.ValueTypeStr {
			by.label = truncate(l.Str(), maxLabelBytes)
		}
		*side.by = by
	}
	return out, true
}

// merge folds o into s (Chan's parallel update; the extremes: the lowest rank on a tie).
func (s *spread) merge(o spread) {
	if !s.known || !o.known {
		*s = spread{}
		return
	}
	if o.n == 0 {
		return
	}
	if s.n == 0 {
		*s = o
		return
	}
	n := s.n + o.n
	delta := o.mean - s.mean
	s.mean += delta * float64(o.n) / float64(n)
	s.m2 += o.m2 + delta*delta*float64(s.n)*float64(o.n)/float64(n)
	s.n = n
	if o.low < s.low || (o.low == s.low && o.lowBy.rank < s.lowBy.rank) {
		s.low, s.lowBy = o.low, o.lowBy
	}
	if o.high > s.high || (o.high == s.high && o.highBy.rank < s.highBy.rank) {
		s.high, s.highBy = o.high, o.highBy
	}
}

// encode puts a known spread on a merged point's attributes (an unknown one: nothing).
func (s *spread) encode(attrs pcommon.Map) {
	if !s.known {
		return
	}
	attrs.PutInt(attrSpreadN, s.n)
	if s.n == 0 {
		return
	}
	attrs.PutDouble(attrSpreadMean, s.mean)
	attrs.PutDouble(attrSpreadM2, s.m2)
	attrs.PutDouble(attrSpreadLow, s.low)
	attrs.PutInt(attrSpreadLowRank, s.lowBy.rank)
	attrs.PutStr(attrSpreadLowLabel, s.lowBy.label)
	attrs.PutDouble(attrSpreadHigh, s.high)
	attrs.PutInt(attrSpreadHighRank, s.highBy.rank)
	attrs.PutStr(attrSpreadHighLabel, s.highBy.label)
}
