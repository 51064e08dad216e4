package rankscopemergeprocessor

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/consumer"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/processor"
	"go.opentelemetry.io/otel/metric"
	"go.uber.org/zap"

	"github.com/rankscope/rankscope/collector/rankscopemergeprocessor/internal/metadata"
)

type mergeProcessor struct {
	cfg       *Config
	next      consumer.Metrics
	logger    *zap.Logger
	telemetry *metadata.TelemetryBuilder // the counters metadata.yaml declares
	perRank   *regexp.Regexp
	host      string
	instance  string

	mu  sync.Mutex // guards win and taken
	win *window
	// taken holds the (instance, window) of merged resources from upstream mergers that this
	// processor has forwarded: an upstream's persistent queue sends a window again when it died
	// before the answer came, and that copy must not be merged twice. Bounded, oldest out.
	taken      map[string]struct{}
	takenOrder []string
	sent       int64      // windows forwarded: each merged resource is numbered, so no two are alike
	sendMu     sync.Mutex // windows leave in the order they were opened
	stop       chan struct{}
	done       sync.WaitGroup
}

func newMergeProcessor(set processor.Settings, cfg *Config, next consumer.Metrics) (*mergeProcessor, error) {
	telemetry, err := metadata.NewTelemetryBuilder(set.TelemetrySettings)
	if err != nil {
		return nil, err
	}
	host, _ := os.Hostname()
	return &mergeProcessor{
		cfg:       cfg,
		next:      next,
		logger:    set.Logger,
		telemetry: telemetry,
		perRank:   cfg.keyMatcher(),
		host:      host,
		instance:  fmt.Sprintf("rankscope-merge/%s/%s/%d-%d", host, set.ID.String(), os.Getpid(), time.Now().UnixNano()),
		win:       newWindow(),
		taken:     map[string]struct{}{},
		stop:      make(chan struct{}),
	}, nil
}

func (p *mergeProcessor) Capabilities() consumer.Capabilities {
	return consumer.Capabilities{MutatesData: true} // unmerged parts are moved, not copied
}

func (p *mergeProcessor) Start(context.Context, component.Host) error {
	p.done.Add(1)
	go func() {
		defer p.done.Done()
		ticker := time.NewTicker(p.cfg.Interval)
		defer ticker.Stop()
		for {
			select {
			case <-ticker.C:
				p.forward()
			case <-p.stop:
				return
			}
		}
	}()
	return nil
}

// Shutdown forwards the open window: a graceful restart keeps what it holds.
func (p *mergeProcessor) Shutdown(context.Context) error {
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	p.done.Wait()
	p.forward()
	p.telemetry.Shutdown()
	return nil
}

// ConsumeMetrics adds the request to the open window and answers when that window has been
// forwarded (or the client gave up: it then sends again, and the sink may count a retried
// state twice, as it would behind any retrying exporter).
func (p *mergeProcessor) ConsumeMetrics(ctx context.Context, md pmetric.Metrics) error {
	if !hasExperiment(md) {
		if n := md.DataPointCount(); n > 0 {
			p.telemetry.ProcessorRankscopemergePointsPassedThrough.Add(ctx, int64(n))
		}
		return p.next.ConsumeMetrics(ctx, md) // not rankscope's: no reason to hold it
	}
	p.mu.Lock()
	w := p.win
	t := p.add(w, md)
	w.requests++
	full := w.points >= p.cfg.MaxPoints
	p.mu.Unlock()
	t.count(ctx, p.telemetry)
	if full {
		p.forward()
	}
	select {
	case <-w.sent:
		return w.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func hasExperiment(md pmetric.Metrics) bool {
	rms := md.ResourceMetrics()
	for i := 0; i < rms.Len(); i++ {
		if v, ok := rms.At(i).Resource().Attributes().Get(attrExperiment); ok && v.Type() == pcommon.ValueTypeStr {
			return true
		}
	}
	return false
}

// forward sends the open window on and answers its requests.
func (p *mergeProcessor) forward() {
	p.sendMu.Lock()
	defer p.sendMu.Unlock()
	p.mu.Lock()
	w := p.win
	if w.points == 0 && w.requests == 0 {
		p.mu.Unlock()
		return
	}
	p.win = newWindow()
	p.mu.Unlock()
	if w.points == 0 { // only copies of windows already taken: answered, nothing to send
		close(w.sent)
		return
	}
	p.sent++
	out := w.build(p.instance, p.host, p.sent)
	w.err = p.next.ConsumeMetrics(context.Background(), out)
	if w.err != nil {
		p.logger.Warn("forwarding a merged window failed; its senders will retry", zap.Error(w.err))
	} else {
		p.mu.Lock()
		for _, id := range w.upstream {
			p.remember(id)
		}
		p.mu.Unlock()
	}
	close(w.sent)
}

const maxTaken = 1 << 16

// remember records an upstream window as taken. Caller holds p.mu.
func (p *mergeProcessor) remember(id string) {
	if _, ok := p.taken[id]; ok {
		return
	}
	p.taken[id] = struct{}{}
	p.takenOrder = append(p.takenOrder, id)
	if len(p.takenOrder) > maxTaken {
		delete(p.taken, p.takenOrder[0])
		p.takenOrder = p.takenOrder[1:]
	}
}

// upstreamWindow is the identity of one group of a window merged upstream (instance, window
// number, experiment, run, attempt and part: a window holds per experiment, run and attempt one
// resource of states and one of rank sets), or "" for a resource that is not one.
func upstreamWindow(res pcommon.Map) string {
	merged, ok := res.Get(attrMerged)
	if !ok || merged.Type() != pcommon.ValueTypeBool || !merged.Bool() {
		return ""
	}
	instance, ok := res.Get(attrInstanceID)
	number, ok2 := res.Get(attrWindow)
	if !ok || !ok2 || instance.Type() != pcommon.ValueTypeStr || number.Type() != pcommon.ValueTypeInt {
		return ""
	}
	experiment, run, attempt, part := "", "", "", ""
	if v, ok := res.Get(attrExperiment); ok {
		experiment = v.AsString()
	}
	if v, ok := res.Get(attrRun); ok {
		run = v.AsString()
	}
	if v, ok := res.Get(attrAttempt); ok {
		attempt = v.AsString()
	}
	if v, ok := res.Get(attrMergePart); ok { // a window's rank sets travel beside its states
		part = v.AsString()
	}
	return fmt.Sprintf("%s\x00%d\x00%s\x00%s\x00%s\x00%s", instance.Str(), number.Int(), experiment, run, attempt, part)
}

// -- the window ------------------------------------------------------------------------

type groupKey struct {
	experiment string
	run        string // a launch of the experiment: runs never merge into each other
	resume     string // the run a resuming launch continues (the sink maps it)
	attempt    int64
	hasAttempt bool
}

type stateKey struct {
	step   int64
	key    string
	reduce string
}

type group struct {
	states map[stateKey]*state
	ranks  map[rankGroup]*rankSet // the flush markers merged (markers.go)
	words  int                    // 64-rank words its rank sets hold
}

type window struct {
	groups   map[groupKey]*group
	order    []groupKey
	unmerged pmetric.Metrics
	points   int
	requests int      // added to this window (the tests wait on it)
	upstream []string // upstream windows merged here (remembered once this one is forwarded)
	sent     chan struct{}
	err      error
}

func (w *window) hasUpstream(id string) bool {
	for _, seen := range w.upstream {
		if seen == id {
			return true
		}
	}
	return false
}

func newWindow() *window {
	return &window{groups: map[groupKey]*group{}, unmerged: pmetric.NewMetrics(), sent: make(chan struct{})}
}

// tally is what one request brought to a window, for the processor's counters (added once per
// request, outside the lock, rather than once per point).
type tally struct {
	merged   int // states merged into the window's groups
	unmerged int // points moved to the window's unmerged part
	replays  int // upstream windows skipped as copies of ones already taken
}

func (t tally) count(ctx context.Context, tb *metadata.TelemetryBuilder) {
	add := func(c metric.Int64Counter, n int) {
		if n > 0 {
			c.Add(ctx, int64(n))
		}
	}
	add(tb.ProcessorRankscopemergeStatesMerged, t.merged)
	add(tb.ProcessorRankscopemergePointsUnmerged, t.unmerged)
	add(tb.ProcessorRankscopemergeWindowsDuplicate, t.replays)
}

// add takes md apart: states it merges go into the window's groups, the rest (per resource,
// in order) into the window's unmerged part.
func (p *mergeProcessor) add(w *window, md pmetric.Metrics) (t tally) {
	rms := md.ResourceMetrics()
	for i := 0; i < rms.Len(); i++ {
		rm := rms.At(i)
		res := rm.Resource().Attributes()
		if id := upstreamWindow(res); id != "" {
			if _, seen := p.taken[id]; seen || w.hasUpstream(id) {
				t.replays++
				continue // an upstream queue's second copy of a window already taken
			}
			w.upstream = append(w.upstream, id)
		}
		g, from, ok := p.groupOf(w, res)
		if ok {
			words := g.words
			t.merged += p.takeStates(w, g, rm, &from) // one holder per resource: its states point to it
			w.points += g.words - words               // a rank set weighs its words: a window's memory stays bounded
		}
		if points := countPoints(rm); points > 0 {
			w.points += points
			t.unmerged += points
			rm.MoveTo(w.unmerged.ResourceMetrics().AppendEmpty())
		}
	}
	return t
}

// groupOf is the (experiment, run, attempt) group of a resource and the process it describes,
// or false when the resource is not one whose states this processor merges.
func (p *mergeProcessor) groupOf(w *window, res pcommon.Map) (*group, holder, bool) {
	v, ok := res.Get(attrExperiment)
	if !ok || v.Type() != pcommon.ValueTypeStr || !cleanName(v.Str()) {
		return nil, holder{}, false
	}
	key := groupKey{experiment: v.Str()}
	if r, ok := res.Get(attrRun); ok {
		key.run = r.AsString()
	}
	if r, ok := res.Get(attrResume); ok {
		key.resume = r.AsString()
	}
	if _, present := res.Get(attrAttempt); present {
		if key.attempt, key.hasAttempt = nonNegativeInt(res, attrAttempt); !key.hasAttempt {
			return nil, holder{}, false
		}
	}
	g := w.groups[key]
	if g == nil {
		g = &group{states: map[stateKey]*state{}, ranks: map[rankGroup]*rankSet{}}
		w.groups[key] = g
		w.order = append(w.order, key)
	}
	rank, _ := nonNegativeInt(res, attrRank)
	merged, found := res.Get(attrMerged)
	isMerged := found && merged.Type() == pcommon.ValueTypeBool && merged.Bool()
	return g, holder{rank: rank, label: label(res, rank), merged: isMerged}, true
}

// label is the process label the sink gives a process (rankscope.core.identity.label_of).
func label(res pcommon.Map, rank int64) string {
	role := "unknown"
	if v, ok := res.Get(attrRole); ok && v.AsString() != "" {
		role = v.AsString()
	} else if v, ok := res.Get(attrServiceName); ok && v.AsString() != "" {
		role = v.AsString()
	}
	var b strings.Builder
	b.WriteString(truncate(role, 256))
	if v, ok := res.Get(attrReplica); ok {
		b.WriteString("_")
		b.WriteString(truncate(v.AsString(), 256))
	}
	fmt.Fprintf(&b, "_r%d", rank)
	return b.String()
}

// takeStates removes from rm every point it merges into g (states, and flush markers into rank
// sets), and says how many.
func (p *mergeProcessor) takeStates(w *window, g *group, rm pmetric.ResourceMetrics, from *holder) int {
	taken := 0
	rm.ScopeMetrics().RemoveIf(func(sm pmetric.ScopeMetrics) bool {
		sm.Metrics().RemoveIf(func(m pmetric.Metric) bool {
			name := m.Name()
			if m.Type() == pmetric.MetricTypeSum { // a marker of another type travels on, for the sink to refuse
				switch {
				case name == metricFlush && !from.merged:
					taken += takeMarkers(g, m, rm.Resource().Attributes())
					return m.Sum().DataPoints().Len() == 0
				case name == metricRanks && from.merged:
					taken += takeRankSets(g, m)
					return m.Sum().DataPoints().Len() == 0
				}
			}
			if !cleanName(name) || strings.HasPrefix(name, "rankscope.") || (p.perRank != nil && p.perRank.MatchString(name)) {
				return false // goodbyes, markers not merged and per-rank keys travel unmerged
			}
			take := func(attrs pcommon.Map, decode func(reduceKind) (*state, bool)) bool {
				ok := p.take(w, g, m, attrs, decode)
				if ok {
					taken++
				}
				return ok
			}
			switch m.Type() {
			case pmetric.MetricTypeSum:
				m.Sum().DataPoints().RemoveIf(func(dp pmetric.NumberDataPoint) bool {
					return take(dp.Attributes(), func(k reduceKind) (*state, bool) { return decodeNumber(k, dp, from) })
				})
				return m.Sum().DataPoints().Len() == 0
			case pmetric.MetricTypeGauge:
				m.Gauge().DataPoints().RemoveIf(func(dp pmetric.NumberDataPoint) bool {
					return take(dp.Attributes(), func(k reduceKind) (*state, bool) { return decodeNumber(k, dp, from) })
				})
				return m.Gauge().DataPoints().Len() == 0
			case pmetric.MetricTypeHistogram:
				m.Histogram().DataPoints().RemoveIf(func(dp pmetric.HistogramDataPoint) bool {
					return take(dp.Attributes(), func(k reduceKind) (*state, bool) { return decodeHistogram(k, dp, from) })
				})
				return m.Histogram().DataPoints().Len() == 0
			case pmetric.MetricTypeExponentialHistogram:
				m.ExponentialHistogram().DataPoints().RemoveIf(func(dp pmetric.ExponentialHistogramDataPoint) bool {
					return take(dp.Attributes(), func(reduceKind) (*state, bool) { return decodeExponential(dp) })
				})
				return m.ExponentialHistogram().DataPoints().Len() == 0
			default:
				return false
			}
		})
		return sm.Metrics().Len() == 0
	})
	return taken
}

// take merges one point into g when it is a rankscope state this processor knows.
func (p *mergeProcessor) take(w *window, g *group, m pmetric.Metric, attrs pcommon.Map, decode func(reduceKind) (*state, bool)) bool {
	reduce, step, ok := pointKey(attrs)
	if !ok {
		return false
	}
	kind, known := reduceKinds[reduce]
	if !known || pointType[kind] != m.Type() {
		return false
	}
	s, ok := decode(kind)
	if !ok {
		return false
	}
	s.unit = m.Unit()
	k := stateKey{step: step, key: m.Name(), reduce: reduce}
	if found := g.states[k]; found != nil {
		found.merge(s)
	} else {
		g.states[k] = s
		w.points++
	}
	return true
}

// pointKey is a point's reduce type (lower case, as the sink reads it) and step; false
// without both (a point without a step joins whatever step the sink has open: not ours).
func pointKey(attrs pcommon.Map) (string, int64, bool) {
	r, ok := attrs.Get(attrReduce)
	if !ok || r.Type() != pcommon.ValueTypeStr {
		return "", 0, false
	}
	s, ok := attrs.Get(attrStep)
	if !ok || s.Type() != pcommon.ValueTypeInt || s.Int() < 0 {
		return "", 0, false
	}
	return strings.ToLower(r.Str()), s.Int(), true
}

func countPoints(rm pmetric.ResourceMetrics) int {
	n := 0
	sms := rm.ScopeMetrics()
	for i := 0; i < sms.Len(); i++ {
		ms := sms.At(i).Metrics()
		for j := 0; j < ms.Len(); j++ {
			n += max(1, pointCount(ms.At(j)))
		}
	}
	return n
}

func pointCount(m pmetric.Metric) int {
	switch m.Type() {
	case pmetric.MetricTypeSum:
		return m.Sum().DataPoints().Len()
	case pmetric.MetricTypeGauge:
		return m.Gauge().DataPoints().Len()
	case pmetric.MetricTypeHistogram:
		return m.Histogram().DataPoints().Len()
	case pmetric.MetricTypeExponentialHistogram:
		return m.ExponentialHistogram().DataPoints().Len()
	case pmetric.MetricTypeSummary:
		return m.Summary().DataPoints().Len()
	default:
		return 0
	}
}

// build is the window as one request: per (experiment, run, attempt), one resource holding its
// merged states; then everything unmerged, in arrival order; then per (experiment, run,
// attempt) one resource holding its rank sets (so a flush marker, merged or not, still follows
// the data it closes).
func (w *window) build(instance, host string, seq int64) pmetric.Metrics {
	out := pmetric.NewMetrics()
	for _, gk := range w.order {
		g := w.groups[gk]
		if len(g.states) == 0 {
			continue
		}
		rm := out.ResourceMetrics().AppendEmpty()
		mergedResource(rm.Resource().Attributes(), gk, instance, host, seq)
		sm := rm.ScopeMetrics().AppendEmpty()
		sm.Scope().SetName("rankscope.merge")
		keys := make([]stateKey, 0, len(g.states))
		for k := range g.states {
			keys = append(keys, k)
		}
		sort.Slice(keys, func(i, j int) bool {
			a, b := keys[i], keys[j]
			if a.key != b.key {
				return a.key < b.key
			}
			if a.reduce != b.reduce {
				return a.reduce < b.reduce
			}
			return a.step < b.step
		})
		var metric pmetric.Metric
		for i, k := range keys {
			s := g.states[k]
			if i == 0 || k.key != keys[i-1].key || k.reduce != keys[i-1].reduce {
				metric = newMetric(sm.Metrics(), k.key, s.unit, s.kind)
			}
			s.encode(metric, k.reduce, k.step)
		}
	}
	w.unmerged.ResourceMetrics().MoveAndAppendTo(out.ResourceMetrics())
	for _, gk := range w.order {
		w.buildRanks(out, gk, w.groups[gk], instance, host, seq)
	}
	return out
}

// mergedResource writes the attributes of a window's resource for group gk.
func mergedResource(res pcommon.Map, gk groupKey, instance, host string, seq int64) {
	res.PutStr(attrExperiment, gk.experiment)
	if gk.run != "" {
		res.PutStr(attrRun, gk.run)
	}
	if gk.resume != "" {
		res.PutStr(attrResume, gk.resume)
	}
	if gk.hasAttempt {
		res.PutInt(attrAttempt, gk.attempt)
	}
	res.PutBool(attrMerged, true)
	// The sink takes a request it has seen before as a client's retry; two windows that merged
	// to the same states are not one, so each carries its number.
	res.PutInt(attrWindow, seq)
	res.PutStr(attrServiceName, "rankscope-merge")
	res.PutStr(attrInstanceID, instance)
	if host != "" {
		res.PutStr(attrHostName, host)
	}
}
