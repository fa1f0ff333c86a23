/* dtpo's virtual GPUs: a stand-in for libnvidia-ml.so.1 (NVML) whose GPUs follow dtpo's GPU simulator.
 *
 * It exports, with NVML's own signatures, return codes and units (milliwatts, millijoules, MHz), the NVML
 * functions dtpo (and nvidia-ml-py's helpers it uses) call, so the real nvidia-ml-py binding runs unmodified
 * on a machine with no GPU. State lives in $DTPO_VIRTUAL_GPUS/state.bin (see state.h), shared by every
 * process: a power limit one process sets is the limit another reads, the energy counter is one counter.
 *
 * What it models: the board power under the limit and clock lock in force (tables precomputed by dtpo from
 * its calibrated GPU model), an energy counter in mJ that advances with wall time at that power, limit
 * constraints (INVALID_ARGUMENT outside them), NO_PERMISSION for setters unless the state says "root",
 * NOT_SUPPORTED for what a GPU model lacks (no energy counter or clock locks before Volta, no MIG, no power
 * smoothing unless made with it), and faults: a GPU that is lost (GPU_IS_LOST), a counter offset that makes it
 * wrap or jump back. Power smoothing (NVML's GB200 API: preset profiles with a floor and ramp limits, read through
 * field values) keeps power at or above the active profile's floor while it is on; its ramps are stored and read
 * back, not modelled (the stand-in's power only changes when a knob does).
 *
 * It is not NVIDIA's library and never claims to be: dtpoVirtualGpuDescribe(), which the real library
 * does not have, tells dtpo that its figures are simulated.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "state.h"

typedef int nvmlReturn_t;
typedef vg_gpu *nvmlDevice_t;

typedef struct {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

typedef union {
    double dVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    long long sllVal;
    int siVal;
    unsigned short usVal;
} nvmlValue_t;

typedef struct {
    unsigned int fieldId;
    unsigned int scopeId;
    long long timestamp;   /* microseconds */
    long long latencyUsec;
    int valueType;         /* NVML_VALUE_TYPE_* */
    nvmlReturn_t nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;

typedef struct {
    unsigned int version;
    unsigned int profileId;
    unsigned int paramId;
    double value;
} nvmlPowerSmoothingProfile_t;

typedef struct {
    unsigned int version;
    unsigned int state; /* NVML_FEATURE_DISABLED or NVML_FEATURE_ENABLED */
} nvmlPowerSmoothingState_t;

#define NVML_POWER_SMOOTHING_PROFILE_V1 0x1000018u
#define NVML_POWER_SMOOTHING_STATE_V1 0x1000008u
enum { NVML_VALUE_TYPE_DOUBLE = 0, NVML_VALUE_TYPE_UNSIGNED_INT = 1 };
enum { /* NVML_FI_PWR_SMOOTHING_* */
    FI_SMOOTHING_ENABLED = 251,
    FI_SMOOTHING_MAX_FLOOR = 256,
    FI_SMOOTHING_MIN_FLOOR = 257,
    FI_SMOOTHING_PROFILES = 259,
    FI_SMOOTHING_PROFILE_FLOOR = 260,
    FI_SMOOTHING_PROFILE_RAMP_UP = 261,
    FI_SMOOTHING_PROFILE_RAMP_DOWN = 262,
    FI_SMOOTHING_PROFILE_HYSTERESIS = 263,
    FI_SMOOTHING_ACTIVE_PROFILE = 264,
};

enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

enum { NVML_CLOCK_GRAPHICS = 0, NVML_CLOCK_SM = 1, NVML_CLOCK_MEM = 2, NVML_CLOCK_VIDEO = 3 };
enum { NVML_TEMPERATURE_GPU = 0 };

#define VERSION_STRING "dtpo-virtual-1"

static pthread_mutex_t g_mutex = PTHREAD_MUTEX_INITIALIZER;
static int g_refs;                  /* nvmlInit minus nvmlShutdown */
static int g_fd = -1;
static vg_state *g_state;
static char g_log_path[4096];
static char g_state_path[4096];
static pthread_once_t g_atfork_once = PTHREAD_ONCE_INIT;

/* A forked child shares the parent's open file, and so its flock: give it a file of its own, or the two
 * would update the shared state unexcluded. The mapping stays (MAP_SHARED survives fork). */
static void reopen_in_child(void) {
    pthread_mutex_init(&g_mutex, NULL);
    if (g_fd < 0) return;
    int fd = open(g_state_path, O_RDWR | O_CLOEXEC);
    close(g_fd);
    g_fd = fd;
}

static void register_atfork(void) { pthread_atfork(NULL, NULL, reopen_in_child); }

/* -- locking and the shared file ------------------------------------------------------------------------- */

static void lock_state(void) {
    pthread_mutex_lock(&g_mutex);
    if (g_fd >= 0) {
        while (flock(g_fd, LOCK_EX) != 0 && errno == EINTR) {
        }
    }
}

static void unlock_state(void) {
    if (g_fd >= 0) flock(g_fd, LOCK_UN);
    pthread_mutex_unlock(&g_mutex);
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void log_call(const char *name, vg_gpu *gpu, const char *args, nvmlReturn_t ret) {
    if (!g_state || !g_state->log_calls || !g_log_path[0]) return;
    int index = gpu && gpu >= g_state->gpus && gpu < g_state->gpus + g_state->count ? (int)(gpu - g_state->gpus) : -1;
    char line[512];
    int n = snprintf(line, sizeof line, "%d %s %d %s %d\n", (int)getpid(), name, index, args ? args : "-", ret);
    if (n <= 0) return;
    int fd = open(g_log_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) return;
    ssize_t unused = write(fd, line, (size_t)(n < (int)sizeof line ? n : (int)sizeof line - 1));
    (void)unused;
    close(fd);
}

static nvmlReturn_t open_state(void) {
    const char *dir = getenv("DTPO_VIRTUAL_GPUS");
    if (!dir || !dir[0]) return NVML_ERROR_DRIVER_NOT_LOADED;
    char *path = g_state_path;
    if (snprintf(path, sizeof g_state_path, "%s/state.bin", dir) >= (int)sizeof g_state_path)
        return NVML_ERROR_DRIVER_NOT_LOADED;
    snprintf(g_log_path, sizeof g_log_path, "%s/calls.log", dir);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) return NVML_ERROR_DRIVER_NOT_LOADED;
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size != (off_t)sizeof(vg_state)) {
        close(fd);
        return NVML_ERROR_LIB_RM_VERSION_MISMATCH;
    }
    void *map = mmap(NULL, sizeof(vg_state), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        close(fd);
        return NVML_ERROR_UNKNOWN;
    }
    vg_state *state = map;
    if (state->magic != VG_MAGIC || state->version != VG_VERSION || state->count > VG_MAX_GPUS) {
        munmap(map, sizeof(vg_state));
        close(fd);
        return NVML_ERROR_LIB_RM_VERSION_MISMATCH;
    }
    g_fd = fd;
    g_state = state;
    return NVML_SUCCESS;
}

static void close_state(void) {
    if (g_state) munmap(g_state, sizeof(vg_state));
    if (g_fd >= 0) close(g_fd);
    g_state = NULL;
    g_fd = -1;
}

/* -- the power model --------------------------------------------------------------------------------------- */

static double interpolate(const float *xs, const float *ys, uint32_t n, double x) {
    if (n == 0) return 0.0;
    if (x <= xs[0]) return ys[0];
    for (uint32_t i = 1; i < n; i++) {
        if (x <= xs[i]) {
            double span = xs[i] - xs[i - 1];
            double w = span > 0 ? (x - xs[i - 1]) / span : 1.0;
            return ys[i - 1] + w * (ys[i] - ys[i - 1]);
        }
    }
    return ys[n - 1];
}

/* Index of the highest supported clock at or below mhz (the driver snaps a lock down), or 0. */
static uint32_t clock_index(const vg_gpu *g, uint32_t mhz) {
    uint32_t best = 0;
    for (uint32_t i = 0; i < g->n_clocks; i++)
        if (g->clocks_mhz[i] <= mhz) best = i;
    return best;
}

/* Busy power, SM clock and time factor under the limit and lock in force: whichever binds first. */
static void settle_all(const vg_gpu *g, double *busy_w, double *clock_mhz, double *time_factor) {
    double limit_w = g->limit_mw / 1000.0;
    double power = interpolate(g->limit_w, g->limit_busy_w, g->n_limits, limit_w);
    double clock = interpolate(g->limit_w, g->limit_clock_mhz, g->n_limits, limit_w);
    double factor = interpolate(g->limit_w, g->limit_time_factor, g->n_limits, limit_w);
    if (g->locked_max_mhz && g->n_clocks) {
        uint32_t i = clock_index(g, g->locked_max_mhz);
        if (g->clock_busy_w[i] < power) {
            power = g->clock_busy_w[i];
            clock = g->clocks_mhz[i];
            factor = g->clock_time_factor[i];
        }
    }
    *busy_w = power;
    *clock_mhz = clock;
    *time_factor = factor;
}

static void settle(const vg_gpu *g, double *busy_w, double *clock_mhz) {
    double factor;
    settle_all(g, busy_w, clock_mhz, &factor);
}

/* Power smoothing's floor in force, in W (0 when it is off): the active profile's share of the total module
 * power, taken as the GPU's highest power limit. */
static double smoothing_floor_w(const vg_gpu *g) {
    if (!(g->flags & VG_HAS_POWER_SMOOTHING) || !g->smoothing_enabled || g->smoothing_profile >= VG_SMOOTHING_PROFILES)
        return 0.0;
    return g->smoothing_params[g->smoothing_profile][0] / 100.0 * (g->max_limit_mw / 1000.0);
}

static double power_now_w(const vg_gpu *g) {
    double busy, clock;
    settle(g, &busy, &clock);
    double power = g->idle_w + g->utilization * (busy - g->idle_w);
    double floor = smoothing_floor_w(g);
    double limit = g->limit_mw / 1000.0;
    if (floor > limit) floor = limit; /* the power limit still caps it */
    return power < floor ? floor : power;
}

/* Brings the energy counter up to now at the power in force until now; call before any change of it. */
static void advance(vg_gpu *g) {
    int64_t t = now_ns();
    if (g->updated_ns > 0 && t > g->updated_ns) g->energy_mj += power_now_w(g) * (double)(t - g->updated_ns) / 1e6;
    g->updated_ns = t;
}

/* -- argument checks ---------------------------------------------------------------------------------------- */

static nvmlReturn_t check_init(void) { return g_refs > 0 && g_state ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED; }

/* NVML_SUCCESS when `device` is one of ours and answers; call under the lock. */
static nvmlReturn_t check_device(nvmlDevice_t device) {
    nvmlReturn_t ret = check_init();
    if (ret != NVML_SUCCESS) return ret;
    if (device < g_state->gpus || device >= g_state->gpus + g_state->count) return NVML_ERROR_INVALID_ARGUMENT;
    if (device->lost) return NVML_ERROR_GPU_IS_LOST;
    return NVML_SUCCESS;
}

/* Counts a power or energy read and loses the GPU when its fault says so. */
static nvmlReturn_t count_read(vg_gpu *g) {
    g->reads++;
    if (g->lose_after_reads && g->reads > g->lose_after_reads) {
        advance(g);
        g->lost = 1;
        return NVML_ERROR_GPU_IS_LOST;
    }
    return NVML_SUCCESS;
}

#define BEGIN(device)                          \
    lock_state();                              \
    nvmlReturn_t ret = check_device(device);   \
    if (ret == NVML_SUCCESS) {
#define END(name, device, args)                \
    }                                          \
    log_call(name, device, args, ret);         \
    unlock_state();                            \
    return ret;

/* -- initialisation ----------------------------------------------------------------------------------------- */

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    pthread_once(&g_atfork_once, register_atfork);
    pthread_mutex_lock(&g_mutex);
    nvmlReturn_t ret = NVML_SUCCESS;
    if (g_refs == 0) ret = open_state();
    if (ret == NVML_SUCCESS) g_refs++;
    pthread_mutex_unlock(&g_mutex);
    if (ret == NVML_SUCCESS) {
        lock_state();
        log_call("nvmlInit", NULL, "-", ret);
        unlock_state();
    }
    return ret;
}

nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
    lock_state();
    nvmlReturn_t ret = check_init();
    if (ret == NVML_SUCCESS) log_call("nvmlShutdown", NULL, "-", ret);
    if (g_fd >= 0) flock(g_fd, LOCK_UN);
    if (ret == NVML_SUCCESS && --g_refs == 0) close_state();
    pthread_mutex_unlock(&g_mutex);
    return ret;
}

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    lock_state();
    nvmlReturn_t ret = check_init();
    if (ret == NVML_SUCCESS) {
        if (!version) ret = NVML_ERROR_INVALID_ARGUMENT;
        else if (strlen(g_state->driver_version) + 1 > length) ret = NVML_ERROR_INSUFFICIENT_SIZE;
        else strcpy(version, g_state->driver_version);
    }
    unlock_state();
    return ret;
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    if (!version) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(VERSION_STRING) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(version, VERSION_STRING);
    return NVML_SUCCESS;
}

/* -- finding devices ---------------------------------------------------------------------------------------- */

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    lock_state();
    nvmlReturn_t ret = check_init();
    if (ret == NVML_SUCCESS) {
        if (!count) ret = NVML_ERROR_INVALID_ARGUMENT;
        else *count = g_state->count;
    }
    log_call("nvmlDeviceGetCount", NULL, "-", ret);
    unlock_state();
    return ret;
}

nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    lock_state();
    nvmlReturn_t ret = check_init();
    if (ret == NVML_SUCCESS) {
        if (!device || index >= g_state->count) ret = NVML_ERROR_INVALID_ARGUMENT;
        else if (g_state->gpus[index].lost) ret = NVML_ERROR_GPU_IS_LOST;
        else *device = &g_state->gpus[index];
    }
    char args[32];
    snprintf(args, sizeof args, "%u", index);
    log_call("nvmlDeviceGetHandleByIndex", NULL, args, ret);
    unlock_state();
    return ret;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    lock_state();
    nvmlReturn_t ret = check_init();
    if (ret == NVML_SUCCESS) {
        ret = NVML_ERROR_NOT_FOUND;
        if (!uuid || !device) ret = NVML_ERROR_INVALID_ARGUMENT;
        else
            for (uint32_t i = 0; i < g_state->count; i++)
                if (strcmp(g_state->gpus[i].uuid, uuid) == 0) {
                    ret = g_state->gpus[i].lost ? NVML_ERROR_GPU_IS_LOST : NVML_SUCCESS;
                    if (ret == NVML_SUCCESS) *device = &g_state->gpus[i];
                }
    }
    unlock_state();
    return ret;
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    BEGIN(device)
    if (!index) ret = NVML_ERROR_INVALID_ARGUMENT;
    else *index = (unsigned int)(device - g_state->gpus);
    END("nvmlDeviceGetIndex", device, "-")
}

static nvmlReturn_t copy_text(const char *text, char *out, unsigned int length) {
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(text) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(out, text);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    BEGIN(device)
    ret = copy_text(device->name, name, length);
    END("nvmlDeviceGetName", device, "-")
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    BEGIN(device)
    ret = copy_text(device->uuid, uuid, length);
    END("nvmlDeviceGetUUID", device, "-")
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *current, unsigned int *pending) {
    BEGIN(device)
    if (!(device->flags & VG_HAS_MIG)) ret = NVML_ERROR_NOT_SUPPORTED;
    else if (!current || !pending) ret = NVML_ERROR_INVALID_ARGUMENT;
    else *current = *pending = 0; /* NVML_DEVICE_MIG_DISABLE */
    END("nvmlDeviceGetMigMode", device, "-")
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
    BEGIN(device)
    if (!(device->flags & VG_HAS_MIG)) ret = NVML_ERROR_NOT_SUPPORTED;
    else if (!count) ret = NVML_ERROR_INVALID_ARGUMENT;
    else *count = 7;
    END("nvmlDeviceGetMaxMigDeviceCount", device, "-")
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index, nvmlDevice_t *mig) {
    (void)index;
    (void)mig;
    BEGIN(device)
    ret = (device->flags & VG_HAS_MIG) ? NVML_ERROR_NOT_FOUND : NVML_ERROR_NOT_SUPPORTED; /* MIG is off */
    END("nvmlDeviceGetMigDeviceHandleByIndex", device, "-")
}

/* -- power and energy --------------------------------------------------------------------------------------- */

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power) {
    BEGIN(device)
    if (!power) ret = NVML_ERROR_INVALID_ARGUMENT;
    else if ((ret = count_read(device)) == NVML_SUCCESS) *power = (unsigned int)(power_now_w(device) * 1000.0 + 0.5);
    END("nvmlDeviceGetPowerUsage", device, "-")
}

nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t device, unsigned long long *energy) {
    BEGIN(device)
    if (!(device->flags & VG_HAS_ENERGY_COUNTER)) ret = NVML_ERROR_NOT_SUPPORTED;
    else if (!energy) ret = NVML_ERROR_INVALID_ARGUMENT;
    else if ((ret = count_read(device)) == NVML_SUCCESS) {
        advance(device);
        *energy = (unsigned long long)device->energy_mj + device->energy_offset_mj; /* wraps modulo 2^64 */
    }
    END("nvmlDeviceGetTotalEnergyConsumption", device, "-")
}

nvmlReturn_t nvmlDeviceGetPowerManagementLimitConstraints(nvmlDevice_t device, unsigned int *min_mw,
                                                          unsigned int *max_mw) {
    BEGIN(device)
    if (!min_mw || !max_mw) ret = NVML_ERROR_INVALID_ARGUMENT;
    else {
        *min_mw = device->min_limit_mw;
        *max_mw = device->max_limit_mw;
    }
    END("nvmlDeviceGetPowerManagementLimitConstraints", device, "-")
}

nvmlReturn_t nvmlDeviceGetPowerManagementDefaultLimit(nvmlDevice_t device, unsigned int *limit_mw) {
    BEGIN(device)
    if (!limit_mw) ret = NVML_ERROR_INVALID_ARGUMENT;
    else *limit_mw = device->default_limit_mw;
    END("nvmlDeviceGetPowerManagementDefaultLimit", device, "-")
}

nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t device, unsigned int *limit_mw) {
    BEGIN(device)
    if (!limit_mw) ret = NVML_ERROR_INVALID_ARGUMENT;
    else *limit_mw = device->limit_mw;
    END("nvmlDeviceGetPowerManagementLimit", device, "-")
}

nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *limit_mw) {
    return nvmlDeviceGetPowerManagementLimit(device, limit_mw);
}

nvmlReturn_t nvmlDeviceSetPowerManagementLimit(nvmlDevice_t device, unsigned int limit_mw) {
    char args[32];
    snprintf(args, sizeof args, "%u", limit_mw);
    BEGIN(device)
    if (!g_state->root) ret = NVML_ERROR_NO_PERMISSION;
    else if (limit_mw < device->min_limit_mw || limit_mw > device->max_limit_mw) ret = NVML_ERROR_INVALID_ARGUMENT;
    else {
        advance(device);
        device->limit_mw = limit_mw;
    }
    END("nvmlDeviceSetPowerManagementLimit", device, args)
}

/* -- clocks --------------------------------------------------------------------------------------------------- */

nvmlReturn_t nvmlDeviceGetSupportedMemoryClocks(nvmlDevice_t device, unsigned int *count, unsigned int *clocks) {
    BEGIN(device)
    if (!count) ret = NVML_ERROR_INVALID_ARGUMENT;
    else if (*count < 1 || !clocks) {
        *count = 1;
        ret = NVML_ERROR_INSUFFICIENT_SIZE;
    } else {
        *count = 1;
        clocks[0] = device->mem_clock_mhz;
    }
    END("nvmlDeviceGetSupportedMemoryClocks", device, "-")
}

nvmlReturn_t nvmlDeviceGetSupportedGraphicsClocks(nvmlDevice_t device, unsigned int memory_mhz, unsigned int *count,
                                                  unsigned int *clocks) {
    BEGIN(device)
    if (!count) ret = NVML_ERROR_INVALID_ARGUMENT;
    else if (memory_mhz != device->mem_clock_mhz) ret = NVML_ERROR_NOT_FOUND;
    else if (*count < device->n_clocks || !clocks) {
        *count = device->n_clocks;
        ret = NVML_ERROR_INSUFFICIENT_SIZE;
    } else {
        *count = device->n_clocks;
        for (uint32_t i = 0; i < device->n_clocks; i++) clocks[i] = device->clocks_mhz[device->n_clocks - 1 - i];
    }
    END("nvmlDeviceGetSupportedGraphicsClocks", device, "-")
}

nvmlReturn_t nvmlDeviceSetGpuLockedClocks(nvmlDevice_t device, unsigned int min_mhz, unsigned int max_mhz) {
    char args[48];
    snprintf(args, sizeof args, "%u,%u", min_mhz, max_mhz);
    BEGIN(device)
    if (!(device->flags & VG_HAS_LOCKED_CLOCKS)) ret = NVML_ERROR_NOT_SUPPORTED;
    else if (!g_state->root) ret = NVML_ERROR_NO_PERMISSION;
    else if (min_mhz > max_mhz || device->n_clocks == 0 || max_mhz < device->clocks_mhz[0])
        ret = NVML_ERROR_INVALID_ARGUMENT;
    else {
        advance(device);
        device->locked_min_mhz = min_mhz;
        device->locked_max_mhz = max_mhz;
    }
    END("nvmlDeviceSetGpuLockedClocks", device, args)
}

nvmlReturn_t nvmlDeviceResetGpuLockedClocks(nvmlDevice_t device) {
    BEGIN(device)
    if (!(device->flags & VG_HAS_LOCKED_CLOCKS)) ret = NVML_ERROR_NOT_SUPPORTED;
    else if (!g_state->root) ret = NVML_ERROR_NO_PERMISSION;
    else {
        advance(device);
        device->locked_min_mhz = device->locked_max_mhz = 0;
    }
    END("nvmlDeviceResetGpuLockedClocks", device, "-")
}

nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, int type, unsigned int *clock) {
    BEGIN(device)
    double busy, sm;
    settle(device, &busy, &sm);
    if (!clock) ret = NVML_ERROR_INVALID_ARGUMENT;
    else if (type == NVML_CLOCK_GRAPHICS || type == NVML_CLOCK_SM) *clock = (unsigned int)(sm + 0.5);
    else if (type == NVML_CLOCK_MEM) *clock = device->mem_clock_mhz;
    else ret = NVML_ERROR_NOT_SUPPORTED;
    END("nvmlDeviceGetClockInfo", device, "-")
}

nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, int type, unsigned int *clock) {
    BEGIN(device)
    if (!clock) ret = NVML_ERROR_INVALID_ARGUMENT;
    else if ((type == NVML_CLOCK_GRAPHICS || type == NVML_CLOCK_SM) && device->n_clocks)
        *clock = device->clocks_mhz[device->n_clocks - 1];
    else if (type == NVML_CLOCK_MEM) *clock = device->mem_clock_mhz;
    else ret = NVML_ERROR_NOT_SUPPORTED;
    END("nvmlDeviceGetMaxClockInfo", device, "-")
}

/* -- power smoothing (GB200 and later) -------------------------------------------------------------------------- */

static void field_value(const vg_gpu *g, nvmlFieldValue_t *v) {
    int smoothing = (g->flags & VG_HAS_POWER_SMOOTHING) != 0;
    v->timestamp = now_ns() / 1000;
    v->latencyUsec = 0;
    v->nvmlReturn = NVML_SUCCESS;
    v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
    unsigned int scope = v->scopeId;
    switch (v->fieldId) {
    case FI_SMOOTHING_ENABLED: v->value.uiVal = g->smoothing_enabled; break;
    case FI_SMOOTHING_ACTIVE_PROFILE: v->value.uiVal = g->smoothing_profile; break;
    case FI_SMOOTHING_PROFILES: v->value.uiVal = VG_SMOOTHING_PROFILES; break;
    case FI_SMOOTHING_MIN_FLOOR:
        v->valueType = NVML_VALUE_TYPE_DOUBLE;
        v->value.dVal = g->smoothing_min_floor_pct;
        break;
    case FI_SMOOTHING_MAX_FLOOR:
        v->valueType = NVML_VALUE_TYPE_DOUBLE;
        v->value.dVal = g->smoothing_max_floor_pct;
        break;
    case FI_SMOOTHING_PROFILE_FLOOR:
    case FI_SMOOTHING_PROFILE_RAMP_UP:
    case FI_SMOOTHING_PROFILE_RAMP_DOWN:
    case FI_SMOOTHING_PROFILE_HYSTERESIS:
        if (scope >= VG_SMOOTHING_PROFILES) {
            v->nvmlReturn = NVML_ERROR_INVALID_ARGUMENT;
        } else if (v->fieldId == FI_SMOOTHING_PROFILE_FLOOR) {
            v->valueType = NVML_VALUE_TYPE_DOUBLE;
            v->value.dVal = g->smoothing_params[scope][0];
        } else {
            v->value.uiVal = (unsigned int)(g->smoothing_params[scope][v->fieldId - FI_SMOOTHING_PROFILE_FLOOR] + 0.5);
        }
        break;
    default: v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED; return;
    }
    if (!smoothing) v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED; /* every field dtpo asks for is a smoothing field */
}

/* Answers the power smoothing fields; any other field is NOT_SUPPORTED (the call itself succeeds, as NVML's does). */
nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int count, nvmlFieldValue_t *values) {
    BEGIN(device)
    if (count < 0 || (count > 0 && !values)) ret = NVML_ERROR_INVALID_ARGUMENT;
    else
        for (int i = 0; i < count; i++) field_value(device, &values[i]);
    END("nvmlDeviceGetFieldValues", device, "-")
}

/* The checks every power smoothing setter makes, in NVML's order: the feature, then permission. */
static nvmlReturn_t smoothing_settable(const vg_gpu *g) {
    if (!(g->flags & VG_HAS_POWER_SMOOTHING)) return NVML_ERROR_NOT_SUPPORTED;
    if (!g_state->root) return NVML_ERROR_NO_PERMISSION;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDevicePowerSmoothingSetState(nvmlDevice_t device, nvmlPowerSmoothingState_t *state) {
    char args[32];
    snprintf(args, sizeof args, "%u", state ? state->state : 0u);
    BEGIN(device)
    if ((ret = smoothing_settable(device)) != NVML_SUCCESS) {
    } else if (!state || state->state > 1) ret = NVML_ERROR_INVALID_ARGUMENT;
    else if (state->version != NVML_POWER_SMOOTHING_STATE_V1) ret = NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    else {
        advance(device);
        device->smoothing_enabled = state->state;
    }
    END("nvmlDevicePowerSmoothingSetState", device, args)
}

nvmlReturn_t nvmlDevicePowerSmoothingActivatePresetProfile(nvmlDevice_t device, nvmlPowerSmoothingProfile_t *profile) {
    char args[32];
    snprintf(args, sizeof args, "%u", profile ? profile->profileId : 0u);
    BEGIN(device)
    if ((ret = smoothing_settable(device)) != NVML_SUCCESS) {
    } else if (!profile || profile->profileId >= VG_SMOOTHING_PROFILES) ret = NVML_ERROR_INVALID_ARGUMENT;
    else if (profile->version != NVML_POWER_SMOOTHING_PROFILE_V1) ret = NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    else {
        advance(device);
        device->smoothing_profile = profile->profileId;
    }
    END("nvmlDevicePowerSmoothingActivatePresetProfile", device, args)
}

nvmlReturn_t nvmlDevicePowerSmoothingUpdatePresetProfileParam(nvmlDevice_t device,
                                                              nvmlPowerSmoothingProfile_t *profile) {
    char args[64];
    snprintf(args, sizeof args, "%u,%u,%g", profile ? profile->profileId : 0u, profile ? profile->paramId : 0u,
             profile ? profile->value : 0.0);
    BEGIN(device)
    if ((ret = smoothing_settable(device)) != NVML_SUCCESS) {
    } else if (!profile || profile->profileId >= VG_SMOOTHING_PROFILES) ret = NVML_ERROR_INVALID_ARGUMENT;
    else if (profile->version != NVML_POWER_SMOOTHING_PROFILE_V1) ret = NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    else if (profile->paramId >= VG_SMOOTHING_PARAMS) ret = NVML_ERROR_NOT_SUPPORTED; /* the later floor params */
    else if (profile->paramId == 0 && (profile->value < device->smoothing_min_floor_pct ||
                                       profile->value > device->smoothing_max_floor_pct))
        ret = NVML_ERROR_INVALID_ARGUMENT;
    else if (profile->paramId > 0 && !(profile->value >= 0.0)) ret = NVML_ERROR_INVALID_ARGUMENT;
    else {
        advance(device);
        device->smoothing_params[profile->profileId][profile->paramId] = profile->value;
    }
    END("nvmlDevicePowerSmoothingUpdatePresetProfileParam", device, args)
}

/* -- what monitors show --------------------------------------------------------------------------------------- */

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization) {
    BEGIN(device)
    if (!utilization) ret = NVML_ERROR_INVALID_ARGUMENT;
    else {
        utilization->gpu = (unsigned int)(device->utilization * 100.0f + 0.5f);
        utilization->memory = utilization->gpu / 2;
    }
    END("nvmlDeviceGetUtilizationRates", device, "-")
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, int sensor, unsigned int *temperature) {
    BEGIN(device)
    if (sensor != NVML_TEMPERATURE_GPU) ret = NVML_ERROR_NOT_SUPPORTED;
    else if (!temperature) ret = NVML_ERROR_INVALID_ARGUMENT;
    else *temperature = (unsigned int)(30.0 + 40.0 * power_now_w(device) / (device->max_limit_mw / 1000.0));
    END("nvmlDeviceGetTemperature", device, "-")
}

/* -- not NVML: how dtpo tells a virtual GPU from a real one ------------------------------------------------------ */

/* Writes what this GPU is ("virtual GPU ...: simulated ...") into `out`; the real library has no such function. */
nvmlReturn_t dtpoVirtualGpuDescribe(nvmlDevice_t device, char *out, unsigned int length) {
    BEGIN(device)
    ret = copy_text(device->note, out, length);
    END("dtpoVirtualGpuDescribe", device, "-")
}

/* How much longer a step takes under the settings in force than at the default (the simulator's slowdown), times
 * the GPU's straggler fault (slow_factor), for dtpo to add to a CPU step as a labelled delay; NOT_SUPPORTED unless
 * the GPUs were made with slow steps. */
nvmlReturn_t dtpoVirtualGpuTimeFactor(nvmlDevice_t device, double *factor) {
    BEGIN(device)
    double busy, clock;
    if (!g_state->slow_steps) ret = NVML_ERROR_NOT_SUPPORTED;
    else if (!factor) ret = NVML_ERROR_INVALID_ARGUMENT;
    else {
        settle_all(device, &busy, &clock, factor);
        if (device->slow_factor > 1.0f) *factor *= device->slow_factor; /* false for NaN: never below normal */
    }
    END("dtpoVirtualGpuTimeFactor", device, "-")
}

/* sizeof(vg_state), for dtpo to check that its ctypes mirror of state.h has the same layout. */
unsigned long long dtpoVirtualGpuStateSize(void) { return sizeof(vg_state); }
