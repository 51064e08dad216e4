package rankscopemergeprocessor

import (
	"cmp"
	"maps"
	"math/bits"
	"slices"
	"strconv"
	"strings"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pmetric"
)

// Flush markers, merged into rank sets.
//
// Each process sends one `rankscope.flush` point per step it closes, so the sink learns who
// closed a step and whom it still waits for. Unmerged, a tree forwards one marker per rank per
// step and the sink pays per rank, whatever the keys. Here the markers of one (role, replica,
// world size) group are folded into the set of its ranks that closed each step, sent as one
// `rankscope.flush.ranks` point holding the ranks as ascending ranges ("0-7,9"); a gateway
// folds the agents' sets the same way (a union: taking a set twice changes nothing). The sink
// names a missing rank from its group and rank.
//
// A marker stays unmerged (the sink judges it as a process's own) when its process cannot be
// named from a group and rank alone: a controller's or an actor's marker (any attribute but the
// step), a resource without a plain role, or a rank outside its declared world size.

const (
	partRanks      = "ranks"
	maxGroupLength = 256
)

// rankGroup is a (role, replica, world size) group at one step.
type rankGroup struct {
	role       string
	replica    string
	hasReplica bool
	worldSize  int64
	step       int64
}

// rankSet is the ranks of a group that closed its step, one bit each, over the words from the
// lowest rank's to the highest's only (an agent's 8 ranks of a million take one or two words).
type rankSet struct {
	base        int64             // the word of bits[0]: ranks base*64 on
	bits        []uint64          // grown to either side as ranks come
	start, time pcommon.Timestamp // the earliest start and the latest time of the markers taken
}

// word is the word holding rank, the set grown to reach it; grown says by how many words.
func (s *rankSet) word(rank int64) (w *uint64, grown int) {
	i := rank >> 6
	switch {
	case len(s.bits) == 0:
		s.base, s.bits, grown = i, make([]uint64, 1), 1
	case i < s.base:
		grown = int(s.base - i)
		s.bits = append(make([]uint64, grown, grown+len(s.bits)), s.bits...)
		s.base = i
	case i >= s.base+int64(len(s.bits)):
		grown = int(i - s.base - int64(len(s.bits)) + 1)
		s.bits = append(s.bits, make([]uint64, grown)...)
	}
	return &s.bits[i-s.base], grown
}

func (s *rankSet) add(rank int64) int {
	w, grown := s.word(rank)
	*w |= 1 << uint(rank&63)
	return grown
}

func (s *rankSet) addRange(low, high int64) int {
	grown := 0
	if low <= high {
		_, grown = s.word(low)
		_, more := s.word(high)
		grown += more
	}
	for r := low; r <= high; {
		if r&63 == 0 && high-r >= 63 { // a whole word at once
			s.bits[(r>>6)-s.base] = ^uint64(0)
			r += 64
			continue
		}
		s.add(r)
		r++
	}
	return grown
}

func (s *rankSet) stamp(start, t pcommon.Timestamp) {
	if s.start == 0 || (start != 0 && start < s.start) {
		s.start = start
	}
	if t > s.time {
		s.time = t
	}
}

func (s *rankSet) count() int64 {
	n := 0
	for _, w := range s.bits {
		n += bits.OnesCount64(w)
	}
	return int64(n)
}

// spans is the set as inclusive ranges, ascending, cut into chunks of at most maxSpans.
func (s *rankSet) spans() [][][2]int64 {
	var chunks [][][2]int64
	var cur [][2]int64
	in := false
	var low int64
	first := s.base * 64
	size := first + int64(len(s.bits))*64
	for r := first; r <= size; r++ {
		set := r < size && s.bits[(r>>6)-s.base]&(1<<uint(r&63)) != 0
		if r < size && !set && !in && s.bits[(r>>6)-s.base] == 0 && r&63 == 0 {
			r += 63 // an empty word
			continue
		}
		switch {
		case set && !in:
			in, low = true, r
		case !set && in:
			in = false
			cur = append(cur, [2]int64{low, r - 1})
			if len(cur) == maxSpans {
				chunks = append(chunks, cur)
				cur = nil
			}
		}
	}
	if len(cur) > 0 {
		chunks = append(chunks, cur)
	}
	return chunks
}

func formatSpans(spans [][2]int64) string {
	var b strings.Builder
	for i, sp := range spans {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(sp[0], 10))
		if sp[1] != sp[0] {
			b.WriteByte('-')
			b.WriteString(strconv.FormatInt(sp[1], 10))
		}
	}
	return b.String()
}

// parseSpans reads "0-7,9" as the sink does: ranges within [0, worldSize), ascending and apart,
// at most maxSpans of them; false otherwise.
func parseSpans(text string, worldSize int64) ([][2]int64, bool) {
	if text == "" {
		return nil, false
	}
	parts := strings.Split(text, ",")
	if len(parts) > maxSpans {
		return nil, false
	}
	out := make([][2]int64, 0, len(parts))
	last := int64(-2)
	for _, part := range parts {
		lowText, highText, dash := strings.Cut(part, "-")
		low, ok := digits(lowText)
		if !ok {
			return nil, false
		}
		high := low
		if dash {
			if high, ok = digits(highText); !ok {
				return nil, false
			}
		}
		if !(last+1 < low && low <= high && high < worldSize) {
			return nil, false
		}
		out = append(out, [2]int64{low, high})
		last = high
	}
	return out, true
}

// digits is a rank written in 1 to 7 ASCII digits.
func digits(s string) (int64, bool) {
	if s == "" || len(s) > 7 {
		return 0, false
	}
	var n int64
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
		n = n*10 + int64(s[i]-'0')
	}
	return n, true
}

// plainText is a role or replica a rank set may carry: 1 to 256 bytes of printable ASCII (a
// name outside it leaves the process's markers unmerged, for the sink's edge to judge).
func plainText(s string) bool {
	if s == "" || len(s) > maxGroupLength {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// member is what a process's resource says of its place in a rank set: its group (step unset)
// and rank, or false when its markers cannot be merged.
func member(res pcommon.Map) (rankGroup, int64, bool) {
	var g rankGroup
	if v, ok := res.Get(attrRole); ok && v.AsString() != "" {
		g.role = v.AsString()
	} else if v, ok := res.Get(attrServiceName); ok && v.AsString() != "" {
		g.role = v.AsString()
	}
	if !plainText(g.role) {
		return g, 0, false
	}
	if v, ok := res.Get(attrReplica); ok {
		g.replica, g.hasReplica = v.AsString(), true
		if !plainText(g.replica) {
			return g, 0, false
		}
	}
	if _, ok := res.Get(attrFallback); ok { // its attempt may be wrong: the sink judges it alone
		return g, 0, false
	}
	rank, ok := nonNegativeInt(res, attrRank)
	if !ok {
		return g, 0, false
	}
	g.worldSize = 1
	if _, present := res.Get(attrWorldSize); present {
		if g.worldSize, ok = nonNegativeInt(res, attrWorldSize); !ok {
			return g, 0, false
		}
	}
	if g.worldSize < 1 || g.worldSize > maxWorldSize || rank >= g.worldSize {
		return g, 0, false
	}
	return g, rank, true
}

// set is the window group's rank set of g, made on first use.
func (gr *group) set(g rankGroup) *rankSet {
	s := gr.ranks[g]
	if s == nil {
		s = &rankSet{}
		gr.ranks[g] = s
	}
	return s
}

// takeMarkers removes from m (a process's `rankscope.flush`) every marker it merges into gr's
// rank sets, and says how many.
func takeMarkers(gr *group, m pmetric.Metric, res pcommon.Map) int {
	if m.Type() != pmetric.MetricTypeSum {
		return 0
	}
	g, rank, ok := member(res)
	if !ok {
		return 0
	}
	taken := 0
	m.Sum().DataPoints().RemoveIf(func(dp pmetric.NumberDataPoint) bool {
		attrs := dp.Attributes()
		step, ok := attrs.Get(attrStep)
		if attrs.Len() != 1 || !ok || step.Type() != pcommon.ValueTypeInt || step.Int() < 0 {
			return false // a controller's count, an actor's mark, a marker without a step: the sink's
		}
		g.step = step.Int()
		s := gr.set(g)
		gr.words += s.add(rank)
		s.stamp(dp.StartTimestamp(), dp.Timestamp())
		taken++
		return true
	})
	return taken
}

// takeRankSets removes from m (an upstream merger's `rankscope.flush.ranks`) every set it
// merges into gr's, and says how many; a point that does not read as one travels on unmerged.
func takeRankSets(gr *group, m pmetric.Metric) int {
	if m.Type() != pmetric.MetricTypeSum {
		return 0
	}
	taken := 0
	m.Sum().DataPoints().RemoveIf(func(dp pmetric.NumberDataPoint) bool {
		attrs := dp.Attributes()
		var g rankGroup
		step, ok := attrs.Get(attrStep)
		if !ok || step.Type() != pcommon.ValueTypeInt || step.Int() < 0 {
			return false
		}
		g.step = step.Int()
		role, ok := attrs.Get(attrRole)
		if !ok || role.Type() != pcommon.ValueTypeStr || !plainText(role.Str()) {
			return false
		}
		g.role = role.Str()
		if replica, ok := attrs.Get(attrReplica); ok {
			if replica.Type() != pcommon.ValueTypeStr || !plainText(replica.Str()) {
				return false
			}
			g.replica, g.hasReplica = replica.Str(), true
		}
		size, ok := attrs.Get(attrWorldSize)
		if !ok || size.Type() != pcommon.ValueTypeInt || size.Int() < 1 || size.Int() > maxWorldSize {
			return false
		}
		g.worldSize = size.Int()
		text, ok := attrs.Get(attrRanks)
		if !ok || text.Type() != pcommon.ValueTypeStr {
			return false
		}
		spans, ok := parseSpans(text.Str(), g.worldSize)
		if !ok {
			return false
		}
		s := gr.set(g)
		for _, sp := range spans {
			gr.words += s.addRange(sp[0], sp[1])
		}
		s.stamp(dp.StartTimestamp(), dp.Timestamp())
		taken++
		return true
	})
	return taken
}

// buildRanks appends to out, for group gk, one resource holding its rank sets (after the
// window's merged states and unmerged points: a marker follows the data it closes).
func (w *window) buildRanks(out pmetric.Metrics, gk groupKey, g *group, instance, host string, seq int64) {
	if len(g.ranks) == 0 {
		return
	}
	rm := out.ResourceMetrics().AppendEmpty()
	mergedResource(rm.Resource().Attributes(), gk, instance, host, seq)
	rm.Resource().Attributes().PutStr(attrMergePart, partRanks)
	sm := rm.ScopeMetrics().AppendEmpty()
	sm.Scope().SetName("rankscope.merge")
	m := sm.Metrics().AppendEmpty()
	m.SetName(metricRanks)
	m.SetUnit("{rank}")
	sum := m.SetEmptySum()
	sum.SetAggregationTemporality(pmetric.AggregationTemporalityDelta)
	sum.SetIsMonotonic(true)
	keys := slices.SortedFunc(maps.Keys(g.ranks), func(a, b rankGroup) int {
		return cmp.Or(
			cmp.Compare(a.role, b.role),
			boolCompare(a.hasReplica, b.hasReplica),
			cmp.Compare(a.replica, b.replica),
			cmp.Compare(a.worldSize, b.worldSize),
			cmp.Compare(a.step, b.step),
		)
	})
	for _, k := range keys {
		s := g.ranks[k]
		for _, chunk := range s.spans() {
			dp := sum.DataPoints().AppendEmpty()
			dp.SetStartTimestamp(s.start)
			dp.SetTimestamp(s.time)
			var n int64
			for _, sp := range chunk {
				n += sp[1] - sp[0] + 1
			}
			dp.SetIntValue(n)
			attrs := dp.Attributes()
			attrs.PutInt(attrStep, k.step)
			attrs.PutStr(attrRole, k.role)
			if k.hasReplica {
				attrs.PutStr(attrReplica, k.replica)
			}
			attrs.PutInt(attrWorldSize, k.worldSize)
			attrs.PutStr(attrRanks, formatSpans(chunk))
		}
	}
}

// boolCompare orders false before true (a group without a replica before those with one).
func boolCompare(a, b bool) int {
	switch {
	case a == b:
		return 0
	case !a:
		return -1
	default:
		return 1
	}
}
