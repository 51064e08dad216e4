// Package rankscopemergeprocessor merges rankscope reduce states as they pass a Collector,
// so that a tree of Collectors (an agent per node, a gateway per experiment) reduces an
// experiment of thousands of ranks before its sink sees it: the sink receives one state per
// key per step per upstream instead of one per rank.
//
// A state merges exactly (MEAN by count, STD pooled, SUM and COUNT added, MIN/MAX with the
// rank holding the extreme, LAST by time, DISTRIBUTION bucket-wise), so merging in any
// grouping gives the sink's own result. Flush markers (they name the contributors, so the
// sink knows who reported and who is missing) merge into rank sets per group and step
// (markers.go). Everything else travels on unmerged and in order: goodbyes, points without a
// step, custom reduce types, keys asked for per rank, markers that cannot be put in a set,
// and whatever this processor does not understand (the sink's edge judges it).
//
// A request is answered only once its window has been forwarded to the next stage (the
// exporter's persistent queue): what a client has been told was taken is never only in
// memory here.
//
// metadata.yaml declares the component (type, stability, its own counters) the way
// opentelemetry-collector-contrib's components do; mdatagen generates internal/metadata from it.
//
//go:generate mdatagen metadata.yaml
package rankscopemergeprocessor
