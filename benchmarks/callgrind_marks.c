/* Marks for a process run under valgrind --tool=callgrind --instr-atstart=no: count only
   between start and stop, and write that count to a dump named after the section, so one
   process measures several sections and its start-up is neither counted nor slowed.
   Built by benchmarks/option_cost.py with gcc (needs valgrind's headers). */
#include <valgrind/callgrind.h>

void durq_cg_start(void) {
    CALLGRIND_START_INSTRUMENTATION;
    CALLGRIND_ZERO_STATS;
}

void durq_cg_stop(const char *name) {
    CALLGRIND_DUMP_STATS_AT(name);
    CALLGRIND_STOP_INSTRUMENTATION;
}
