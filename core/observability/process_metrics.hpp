// What Prometheus' client libraries export about their process
// (process_resident_memory_bytes, process_open_fds, ...), under the same
// names so that standard dashboards and alerts work, and
// pdgate_build_info. Read from /proc when scraped: a scrape is rare, and
// procfs reads do not wait on a disk.
#pragma once

#include "core/observability/prometheus.hpp"

namespace pdgate {

void write_process_metrics(PrometheusText& m);

// pdgate_build_info{version, boost, build_type} 1.
void write_build_info(PrometheusText& m);

}  // namespace pdgate
