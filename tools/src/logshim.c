/* NCCL's ncclDebugLogger_t is C-variadic: format here, hand the text to Rust. */
#include <stdarg.h>
#include <stdio.h>

/* Defined in Rust (src/log.rs). */
extern void ibnet_tools_log_sink(int level, unsigned long flags, const char *file, int line,
                                 const char *msg);

void ibnet_tools_logger(int level, unsigned long flags, const char *file, int line,
                        const char *fmt, ...) {
    char buf[2048];
    va_list ap;
    if (fmt == NULL) return;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    ibnet_tools_log_sink(level, flags, file, line, buf);
}
