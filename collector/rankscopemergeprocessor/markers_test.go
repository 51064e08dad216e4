package rankscopemergeprocessor

import (
	"math/rand"
	"sort"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/pdata/pmetric"
)

// rankRequest is one rank's request as the SDK sends it: a state and its flush marker.
func rankRequest(role, replica string, rank, world int, steps ...int64) pmetric.Metrics {
	md, ms := request(proc{role, rank}, "exp")
	res := md.ResourceMetrics().At(0).Resource().Attributes()
	res.PutStr(attrWorldSize, itoa(world)) // as the SDK writes it: a string
	if replica != "" {
		res.PutStr(attrReplica, replica)
	}
	res.PutStr(attrInstanceID, role+replica+"-"+itoa(rank))
	for _, step := range steps {
		addNumber(ms, "loss", "sum", step, 1, 0)
		addMarker(ms, step)
	}
	return md
}

type rankPoint struct {
	role, replica, ranks string
	world, step, count   int64
}

// rankSets reads every `rankscope.flush.ranks` point forwarded, and checks each sits on a
// resource of rank sets that comes after every other resource of its request.
func rankSets(t *testing.T, sink *consumertest.MetricsSink) []rankPoint {
	t.Helper()
	var out []rankPoint
	for _, md := range sink.AllMetrics() {
		rms := md.ResourceMetrics()
		seenRanks := false
		for i := 0; i < rms.Len(); i++ {
			res := rms.At(i).Resource().Attributes()
			part, isRanks := res.Get(attrMergePart)
			if !isRanks {
				if seenRanks {
					t.Fatal("a resource of rank sets came before other data of its window")
				}
				continue
			}
			seenRanks = true
			if part.Str() != "ranks" {
				t.Fatalf("merge part %q", part.Str())
			}
			if v, _ := res.Get(attrMerged); !v.Bool() {
				t.Fatal("a resource of rank sets is a merged one")
			}
			ms := rms.At(i).ScopeMetrics().At(0).Metrics()
			for j := 0; j < ms.Len(); j++ {
				m := ms.At(j)
				if m.Name() != metricRanks {
					t.Fatalf("%q on a resource of rank sets", m.Name())
				}
				for k := 0; k < m.Sum().DataPoints().Len(); k++ {
					dp := m.Sum().DataPoints().At(k)
					a := dp.Attributes()
					p := rankPoint{count: dp.IntValue()}
					v, _ := a.Get(attrRole)
					p.role = v.Str()
					if v, ok := a.Get(attrReplica); ok {
						p.replica = v.Str()
					}
					v, _ = a.Get(attrRanks)
					p.ranks = v.Str()
					v, _ = a.Get(attrWorldSize)
					p.world = v.Int()
					v, _ = a.Get(attrStep)
					p.step = v.Int()
					out = append(out, p)
				}
			}
		}
	}
	return out
}

func unmergedMarkers(sink *consumertest.MetricsSink) int {
	n := 0
	for _, md := range sink.AllMetrics() {
		rms := md.ResourceMetrics()
		for i := 0; i < rms.Len(); i++ {
			sms := rms.At(i).ScopeMetrics()
			for j := 0; j < sms.Len(); j++ {
				ms := sms.At(j).Metrics()
				for k := 0; k < ms.Len(); k++ {
					if ms.At(k).Name() == metricFlush && ms.At(k).Type() == pmetric.MetricTypeSum {
						n += ms.At(k).Sum().DataPoints().Len()
					}
				}
			}
		}
	}
	return n
}

// The markers of a group's ranks leave as one point per (role, replica, step): the ranks that
// closed it as ranges, counted; a marker that names more than its step (a controller's count)
// or a rank outside its world size travels unmerged, as the process's own.
func TestFlushMarkersMergeIntoRankSetsPerGroupAndStep(t *testing.T) {
	sink := new(consumertest.MetricsSink)
	p := start(t, &Config{Interval: time.Hour, MaxPoints: 1 << 20}, sink)
	var mds []pmetric.Metrics
	for rank := 0; rank < 8; rank++ {
		if rank != 5 {
			mds = append(mds, rankRequest("trainer", "", rank, 8, 3))
		}
		if rank < 4 {
			mds = append(mds, rankRequest("trainer", "", rank, 8, 4)) // step 4: ranks 0-3 so far
		}
	}
	mds = append(mds, rankRequest("generator", "1", 0, 2, 3))
	controller := rankRequest("controller", "", 0, 1, 3)
	ms := controller.ResourceMetrics().At(0).ScopeMetrics().At(0).Metrics()
	ms.At(ms.Len()-1).Sum().DataPoints().At(0).Attributes().PutInt("rankscope.expected_processes", 4)
	outside := rankRequest("trainer", "", 9, 8, 3) // rank 9 of a world of 8: the sink's to judge
	mds = append(mds, controller, outside)
	consume(t, p, mds...)

	got := rankSets(t, sink)
	want := []rankPoint{
		{"generator", "1", "0", 2, 3, 1},
		{"trainer", "", "0-4,6-7", 8, 3, 7},
		{"trainer", "", "0-3", 8, 4, 4},
	}
	if len(got) != len(want) {
		t.Fatalf("rank sets %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("rank set %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	if n := unmergedMarkers(sink); n != 2 {
		t.Fatalf("%d markers travelled unmerged, want the controller's and rank 9's", n)
	}
}

// Ranks split over agents in any grouping reach the gateway's sink as exactly their union,
// and a window an agent's queue sends twice changes nothing.
func TestRankSetsMergeExactlyThroughATreeInAnyGrouping(t *testing.T) {
	rng := rand.New(rand.NewSource(7))
	const world = 1000
	closed := map[int64]map[int]bool{} // step -> ranks that closed it
	gatewaySink := new(consumertest.MetricsSink)
	gateway := start(t, &Config{Interval: time.Hour, MaxPoints: 1 << 20}, gatewaySink)
	for agent := 0; agent < 4; agent++ {
		agentSink := new(consumertest.MetricsSink)
		a := start(t, &Config{Interval: time.Hour, MaxPoints: 1 << 20}, agentSink)
		for window := 0; window < 3; window++ {
			var mds []pmetric.Metrics
			for rank := agent; rank < world; rank += 4 {
				if rng.Intn(3) == 0 {
					continue
				}
				step := int64(rng.Intn(3))
				if closed[step] == nil {
					closed[step] = map[int]bool{}
				}
				closed[step][rank] = true
				mds = append(mds, rankRequest("trainer", "0", rank, world, step))
			}
			consume(t, a, mds...)
		}
		for _, md := range agentSink.AllMetrics() {
			consume(t, gateway, md)
			again := pmetric.NewMetrics()
			md.CopyTo(again)
			consume(t, gateway, again) // the agent's queue sent it again
		}
	}
	got := map[int64]map[int]bool{}
	for _, p := range rankSets(t, gatewaySink) {
		if p.role != "trainer" || p.replica != "0" || p.world != world {
			t.Fatalf("rank set of another group: %+v", p)
		}
		spans, ok := parseSpans(p.ranks, p.world)
		if !ok {
			t.Fatalf("the gateway sent %q, which does not read back", p.ranks)
		}
		n := int64(0)
		for _, sp := range spans {
			n += sp[1] - sp[0] + 1
			for r := sp[0]; r <= sp[1]; r++ {
				if got[p.step] == nil {
					got[p.step] = map[int]bool{}
				}
				got[p.step][int(r)] = true
			}
		}
		if n != p.count {
			t.Fatalf("a rank set of %d ranks counted %d", n, p.count)
		}
	}
	for step, ranks := range closed {
		if len(got[step]) != len(ranks) {
			t.Fatalf("step %d: %d ranks arrived, %d closed it", step, len(got[step]), len(ranks))
		}
		for r := range ranks {
			if !got[step][r] {
				t.Fatalf("step %d: rank %d closed it and is not in the sets", step, r)
			}
		}
	}
	if n := unmergedMarkers(gatewaySink); n != 0 {
		t.Fatalf("%d markers travelled unmerged", n)
	}
}

// A set of more ranges than one point may hold is sent as several, each readable, together
// exactly the set.
func TestALargeScatteredRankSetIsSentInPointsTheSinkReads(t *testing.T) {
	const world = 300_000
	s := &rankSet{bits: make([]uint64, (world+63)/64)}
	for r := int64(0); r < world; r += 2 {
		s.add(r)
	}
	s.addRange(1000, 1063)
	chunks := s.spans()
	if len(chunks) != 3 {
		t.Fatalf("%d points for 149,969 ranges, want 3", len(chunks))
	}
	total := int64(0)
	for _, chunk := range chunks {
		text := formatSpans(chunk)
		spans, ok := parseSpans(text, world)
		if !ok || len(spans) > maxSpans {
			t.Fatalf("a point of %d ranges does not read back", len(chunk))
		}
		for _, sp := range spans {
			total += sp[1] - sp[0] + 1
		}
	}
	if total != s.count() || total != world/2+32 {
		t.Fatalf("the points hold %d ranks, the set %d", total, s.count())
	}
}

// What the sink's edge refuses is refused here too (the Python twin: otlp/markers.py parse_spans).
func TestRanksReadAsTheSinkReadsThem(t *testing.T) {
	good := map[string][][2]int64{"0": {{0, 0}}, "0-7,9,12-15": {{0, 7}, {9, 9}, {12, 15}}, "15": {{15, 15}}}
	for text, want := range good {
		got, ok := parseSpans(text, 16)
		if !ok || len(got) != len(want) {
			t.Fatalf("%q: %v %v", text, got, ok)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("%q: %v", text, got)
			}
		}
		if formatSpans(got) != text {
			t.Fatalf("%q written back as %q", text, formatSpans(got))
		}
	}
	for _, text := range []string{"", ",", "0-3,4", "3-1", "0-16", "16", "-1", "1-", "a", "0,0", "2,1", " 1", "+1", "00000001", "1--2", strings.Repeat("0,", 70_000)} {
		if _, ok := parseSpans(text, 16); ok {
			t.Fatalf("%q read as ranks", text)
		}
	}
}

// A rank set from an upstream merger that does not read is passed on unmerged (the sink's edge
// says why), never merged wrong; one from a process's own resource is not taken as a merger's.
func TestARankSetThatDoesNotReadTravelsUnmerged(t *testing.T) {
	sink := new(consumertest.MetricsSink)
	p := start(t, &Config{Interval: time.Hour, MaxPoints: 1 << 20}, sink)
	md := pmetric.NewMetrics()
	rm := md.ResourceMetrics().AppendEmpty()
	res := rm.Resource().Attributes()
	res.PutStr(attrExperiment, "exp")
	res.PutBool(attrMerged, true)
	res.PutStr(attrInstanceID, "upstream")
	res.PutInt(attrWindow, 1)
	res.PutStr(attrMergePart, "ranks")
	m := rm.ScopeMetrics().AppendEmpty().Metrics().AppendEmpty()
	m.SetName(metricRanks)
	sum := m.SetEmptySum()
	for _, ranks := range []string{"0-3,2", "0-3"} {
		dp := sum.DataPoints().AppendEmpty()
		dp.Attributes().PutInt(attrStep, 0)
		dp.Attributes().PutStr(attrRole, "trainer")
		dp.Attributes().PutInt(attrWorldSize, 8)
		dp.Attributes().PutStr(attrRanks, ranks)
	}
	own, ms := request(proc{"trainer", 0}, "exp")
	forged := ms.AppendEmpty()
	forged.SetName(metricRanks)
	dp := forged.SetEmptySum().DataPoints().AppendEmpty()
	dp.Attributes().PutInt(attrStep, 0)
	dp.Attributes().PutStr(attrRanks, "0-7")
	own.ResourceMetrics().MoveAndAppendTo(md.ResourceMetrics())
	consume(t, p, md)
	forwarded := 0
	var texts []string
	for _, out := range sink.AllMetrics() {
		rms := out.ResourceMetrics()
		for i := 0; i < rms.Len(); i++ {
			ms := rms.At(i).ScopeMetrics().At(0).Metrics()
			for j := 0; j < ms.Len(); j++ {
				if ms.At(j).Name() != metricRanks {
					continue
				}
				for k := 0; k < ms.At(j).Sum().DataPoints().Len(); k++ {
					v, _ := ms.At(j).Sum().DataPoints().At(k).Attributes().Get(attrRanks)
					texts = append(texts, v.Str())
					forwarded++
				}
			}
		}
	}
	sort.Strings(texts)
	if strings.Join(texts, " ") != "0-3 0-3,2 0-7" || forwarded != 3 {
		t.Fatalf("forwarded rank sets %v: want the merged 0-3, and the unread and the forged ones as sent", texts)
	}
}

// A marker of another point type (a Gauge `rankscope.flush`, a Gauge rank set on a merged
// resource) travels on unmerged, for the sink's edge to refuse: it never stops the Collector.
func TestAMarkerOfAnotherTypeTravelsOnAndPanicsNothing(t *testing.T) {
	sink := new(consumertest.MetricsSink)
	p := start(t, &Config{Interval: time.Hour, MaxPoints: 1 << 20}, sink)
	md, ms := request(proc{"trainer", 0}, "exp")
	gauge := ms.AppendEmpty()
	gauge.SetName(metricFlush)
	gauge.SetEmptyGauge().DataPoints().AppendEmpty().Attributes().PutInt(attrStep, 1)
	empty := ms.AppendEmpty()
	empty.SetName(metricFlush) // no data at all
	merged := md.ResourceMetrics().AppendEmpty()
	merged.Resource().Attributes().PutStr(attrExperiment, "exp")
	merged.Resource().Attributes().PutBool(attrMerged, true)
	forged := merged.ScopeMetrics().AppendEmpty().Metrics().AppendEmpty()
	forged.SetName(metricRanks)
	forged.SetEmptyGauge().DataPoints().AppendEmpty().Attributes().PutStr(attrRanks, "0")
	consume(t, p, md)
	forwarded := 0
	for _, out := range sink.AllMetrics() {
		rms := out.ResourceMetrics()
		for i := 0; i < rms.Len(); i++ {
			ms := rms.At(i).ScopeMetrics().At(0).Metrics()
			for j := 0; j < ms.Len(); j++ {
				if name := ms.At(j).Name(); name == metricFlush || name == metricRanks {
					forwarded++
				}
			}
		}
	}
	if forwarded != 3 {
		t.Fatalf("%d of the 3 markers of other types travelled on", forwarded)
	}
}

// A rank set holds the words between its lowest and highest rank, not its world's: the ranks of
// a node at the end of a million-rank world take one word, and a window weighs its sets' words,
// so one resource cannot make it allocate a world's bitset per step.
func TestARankSetWeighsTheWordsItsRanksSpan(t *testing.T) {
	sink := new(consumertest.MetricsSink)
	p := start(t, &Config{Interval: time.Hour, MaxPoints: 1 << 20}, sink)
	var mds []pmetric.Metrics
	for rank := 1_048_568; rank < 1_048_576; rank++ {
		mds = append(mds, rankRequest("trainer", "", rank, 1_048_576, 0, 1))
	}
	p.mu.Lock()
	for _, md := range mds {
		p.add(p.win, md)
	}
	words := 0
	for _, g := range p.win.groups {
		words += g.words
	}
	points := p.win.points
	p.mu.Unlock()
	if words != 2 { // one word a step
		t.Fatalf("8 ranks at two steps took %d words, want 2", words)
	}
	if points != 2+2 { // the loss state of each step, and a word of each step's rank set
		t.Fatalf("the window weighs %d points, want 4", points)
	}
	p.forward()
	got := rankSets(t, sink)
	if len(got) != 2 || got[0].ranks != "1048568-1048575" || got[0].count != 8 {
		t.Fatalf("rank sets %+v", got)
	}
}
