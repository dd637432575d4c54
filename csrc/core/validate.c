/*
 * validate.c - the checks that make an existing segment trusted input: its
 * header (sizes, counts, the owner the state word names) and its slots
 * (mutexes of our kind, pids and counts no pyshmlock process exceeds).
 * Openers run them on their mapping before anything is indexed
 * (segment.c), observers on the copies they read (info.c): one verdict,
 * whoever looks, and SHL_ECORRUPT says what was found (shl_corruption).
 */
#include "internal.h"

static int corrupt(shl_corruption *why, uint32_t what, int32_t slot, uint64_t value)
{
    if (why) {
        why->what = what;
        why->slot = slot;
        why->value = value;
    }
    return SHL_ECORRUPT;
}

/* Check a mapped segment of st_size bytes that is marked ready.  Every size
 * and count is checked against the file size before anything is indexed.
 * The file must be exactly the layout's size: shorter would fault (SIGBUS)
 * past its end, longer is not something any pyshmlock process makes.  On
 * SHL_ECORRUPT, *why (if why) says what was found. */
int validate_header(const struct shl_header *hd, size_t st_size, uint32_t *max,
                    shl_corruption *why)
{
    if (hd->magic != SHL_MAGIC)
        return SHL_EFOREIGN;
    if (hd->layout_version != SHL_LAYOUT)
        return SHL_EVERSION;
    if (hd->header_size != sizeof(struct shl_header) || hd->slot_size != sizeof(struct shl_slot))
        return corrupt(why, SHL_CORRUPT_SIZES, -1,
                       ((uint64_t)hd->header_size << 32) | hd->slot_size);
    uint32_t m = hd->max_processes;
    if (m < 1 || m > SHL_MAX_PROCESSES_LIMIT)
        return corrupt(why, SHL_CORRUPT_MAX, -1, m);
    if (hd->total_size != layout_size(m))
        return corrupt(why, SHL_CORRUPT_TOTAL, -1, hd->total_size);
    if (st_size != layout_size(m))
        return SHL_ESIZE;
    /* relaxed: a bounds check of a value that is checked again wherever
     * it is used (owner_index) */
    uint32_t o = owner_of(atomic_load_explicit(&hd->state, memory_order_relaxed));
    if (o > m)
        return corrupt(why, SHL_CORRUPT_OWNER, -1, o);
    *max = m;
    return SHL_OK;
}

/*
 * Check slots [first, first + n) (slot `first` at slots[0]): values no
 * pyshmlock process writes make the segment corrupt.  A slot's mutex must
 * be one of ours (glibc's kind field: slot_mutex_sane), before anything
 * hands it to glibc; its pid must be one the kernel can give (at most
 * PID_MAX_LIMIT); its read count at most the read-hold cap plus one
 * admission attempt per thread (threads are bounded by the pid space, as
 * are its sleeping threads); its owed readers (one per waiting attempt,
 * asyncio tasks too) below 2^31.  Opening runs it over every slot, so does
 * an observer (on its copy): the same verdict, whoever looks.
 */
int validate_slots(const struct shl_slot *slots, uint32_t first, uint32_t n,
                   shl_corruption *why)
{
    for (uint32_t k = 0; k < n; k++) {
        const struct shl_slot *sl = &slots[k];
        int32_t i = (int32_t)(first + k);
        if (!slot_mutex_sane(&sl->owner))
            return corrupt(why, SHL_CORRUPT_MUTEX, i, (uint64_t)(uint32_t)slot_mutex_kind(&sl->owner));
        /* relaxed, all: bounds of values that are bounds-checked again
         * where they are used; any later value is a live process's */
        uint32_t pid = atomic_load_explicit(&sl->pid, memory_order_relaxed);
        if (pid > SHL_PID_LIMIT)
            return corrupt(why, SHL_CORRUPT_PID, i, pid);
        uint32_t readers = atomic_load_explicit(&sl->readers, memory_order_relaxed);
        if (readers > (uint32_t)SHL_READ_HOLDS_MAX + SHL_PID_LIMIT)
            return corrupt(why, SHL_CORRUPT_READERS, i, readers);
        uint32_t waiting = atomic_load_explicit(&sl->waiting, memory_order_relaxed);
        if (waiting > SHL_PID_LIMIT)
            return corrupt(why, SHL_CORRUPT_WAITING, i, waiting);
        for (int p = 0; p < 2; p++) {
            uint32_t owed = atomic_load_explicit(&sl->rwait[p], memory_order_relaxed);
            if (owed > INT32_MAX)
                return corrupt(why, SHL_CORRUPT_OWED, i, owed);
        }
    }
    return SHL_OK;
}
