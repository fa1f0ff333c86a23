/* The shared state of dtpo's virtual GPUs: one file, mapped by every process that loads the stand-in.
 *
 * Python writes it (dtpo.devices.virtual_nvml.state mirrors this layout with ctypes, and checks its size
 * against dtpoVirtualGpuStateSize()); the stand-in for libnvidia-ml.so.1 reads and updates it under an
 * exclusive lock (flock on the file, plus a mutex between threads of one process).
 */
#ifndef DTPO_VIRTUAL_NVML_STATE_H
#define DTPO_VIRTUAL_NVML_STATE_H

#include <stdint.h>

#define VG_MAGIC 0x55504756u /* "VGPU" */
#define VG_VERSION 4u
#define VG_MAX_GPUS 16
#define VG_MAX_CLOCKS 512
#define VG_LIMIT_POINTS 64
#define VG_TEXT 96
#define VG_NOTE 256
#define VG_SMOOTHING_PROFILES 5 /* NVML_POWER_SMOOTHING_MAX_NUM_PROFILES */
#define VG_SMOOTHING_PARAMS 4   /* floor (% of TMP), ramp up (mW/s), ramp down (mW/s), ramp-down hysteresis (ms) */

/* Feature flags of one GPU model: what NVML answers NOT_SUPPORTED for when absent. */
#define VG_HAS_ENERGY_COUNTER 1u /* nvmlDeviceGetTotalEnergyConsumption: Volta and later */
#define VG_HAS_LOCKED_CLOCKS 2u  /* nvmlDeviceSetGpuLockedClocks: Volta and later */
#define VG_HAS_MIG 4u            /* nvmlDeviceGetMigMode answers (disabled) rather than NOT_SUPPORTED */
#define VG_HAS_POWER_SMOOTHING 8u /* nvmlDevicePowerSmoothing* and its fields: GB200 and later */

typedef struct {
    char name[VG_TEXT];         /* what nvmlDeviceGetName returns */
    char uuid[VG_TEXT];         /* "GPU-..." */
    char note[VG_NOTE];         /* the model behind the figures, for dtpoVirtualGpuDescribe */
    uint32_t flags;
    uint32_t min_limit_mw, max_limit_mw, default_limit_mw;
    uint32_t limit_mw;          /* the power limit in force */
    uint32_t mem_clock_mhz;
    uint32_t locked_min_mhz, locked_max_mhz; /* 0, 0: clocks float */
    uint32_t lost;              /* nonzero: every call on this GPU answers GPU_IS_LOST */
    uint32_t lose_after_reads;  /* nonzero: lost once this many power or energy reads were made */
    uint32_t reads;             /* power and energy reads so far, all processes together */
    uint32_t n_limits;          /* points of the limit table */
    uint32_t n_clocks;          /* supported SM clocks, ascending */
    float idle_w;               /* board power with nothing running */
    float utilization;          /* share of time busy, 0..1: power = idle + utilization * (busy - idle) */
    float slow_factor;          /* a straggler fault: the time factor is multiplied by this (1 = normal) */
    float limit_w[VG_LIMIT_POINTS];         /* power limits, ascending */
    float limit_busy_w[VG_LIMIT_POINTS];    /* busy power under each limit, clocks floating */
    float limit_clock_mhz[VG_LIMIT_POINTS]; /* the SM clock it settles at */
    uint32_t clocks_mhz[VG_MAX_CLOCKS];
    float clock_busy_w[VG_MAX_CLOCKS];      /* busy power with clocks locked at each, no limit binding */
    float limit_time_factor[VG_LIMIT_POINTS];  /* time per sample under each limit / at the default setting */
    float clock_time_factor[VG_MAX_CLOCKS];    /* the same with clocks locked at each */
    uint64_t energy_offset_mj;  /* added to the counter (modulo 2^64): faults (a counter that wraps or jumps) */
    double energy_mj;           /* energy since the state was made */
    int64_t updated_ns;         /* CLOCK_MONOTONIC of the last update of energy_mj */
    uint32_t smoothing_enabled; /* power smoothing on: power never falls below the active profile's floor */
    uint32_t smoothing_profile; /* the active preset profile */
    float smoothing_min_floor_pct, smoothing_max_floor_pct; /* the floors a profile may be given */
    double smoothing_params[VG_SMOOTHING_PROFILES][VG_SMOOTHING_PARAMS]; /* in NVML's units, see above */
} vg_gpu;

typedef struct {
    uint32_t magic, version;
    uint32_t count;             /* GPUs */
    uint32_t root;              /* nonzero: setters are allowed (as for root); else NO_PERMISSION */
    uint32_t log_calls;         /* nonzero: append each call to calls.log beside the state */
    uint32_t slow_steps;        /* nonzero: dtpoVirtualGpuTimeFactor answers, and dtpo slows compute by it */
    char driver_version[80];
    vg_gpu gpus[VG_MAX_GPUS];
} vg_state;

#endif
