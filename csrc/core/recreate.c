/*
 * recreate.c - re-creating an unused segment at the size an opener asks
 * for (SHL_OPEN_SIZED): a restart with more workers than the lock was made
 * for gets a lock of its size, never one attached to a segment being
 * removed.  Every handle holds a read lock on the handles' byte
 * (liveness.c); the opener that re-creates holds its write lock, so no
 * other handle exists while it looks and removes (docs/DESIGN.md,
 * "Re-creating an unused segment at another size").  Opening itself is
 * segment.c's (open_once calls in here).
 */
#include "internal.h"

#include <sys/stat.h>

/* Does the lock's name still name the segment st (dev/ino)? */
int names_segment(const char *name, const struct stat *st)
{
    char file[SHL_PATH_MAX];
    struct stat now;
    shl_segment_path(name, 1, file, sizeof file);
    return stat(file, &now) == 0 && now.st_dev == st->st_dev && now.st_ino == st->st_ino;
}

/* Nothing in the segment: no process's slot (count_others reclaims dead
 * ones first), no pause, claim, session, suspect mark, armed lease or
 * raised fence.  Called with the handles' byte write-locked: no handle of
 * the segment exists anywhere, and none can appear. */
static int segment_unused(struct shl_header *hd, uint32_t max, int lfd, const struct stat *st)
{
    if (count_others(hd, max, lfd, (uint64_t)st->st_dev, (uint64_t)st->st_ino) != 0)
        return 0;
    uint32_t s = atomic_load_explicit(&hd->state, memory_order_seq_cst);
    /* relaxed: nobody else can write them now (see above) */
    return (s & (ST_CLAIM_BITS | ST_PAUSED | ST_PINNED | ST_SUSPECT)) == 0 &&
           atomic_load_explicit(&hd->lease_deadline_ns, memory_order_relaxed) == 0 &&
           atomic_load_explicit(&hd->fence, memory_order_relaxed) == 0 &&
           atomic_load_explicit(&hd->applied, memory_order_relaxed) == 0;
}

/*
 * An opener that asked for another max_processes (SHL_OPEN_SIZED) than the
 * existing segment has (mapped and validated, lfd its liveness descriptor).
 * Its first lock on the handles' byte is the write lock, had only if no
 * other handle of the segment exists anywhere (liveness.c, "the segment's
 * handles"); then, if the segment is still the name's and unused, the name
 * is removed (exactly this segment) and the caller opens again, creating it
 * at the asked size: OPEN_AGAIN.  Otherwise this opener keeps the byte's
 * read lock, as any opener, and the segment stays: SHL_OK (the caller
 * refuses an ask for more slots than it has, SHL_EFULL).  Openers racing
 * to re-create it: the first takes the write lock; the others wait for the
 * read lock, then find the name naming the new segment (OPEN_AGAIN).
 */
int recreate_unused(struct shl_header *hd, uint32_t max, int lfd, const struct stat *st,
                    const char *name)
{
    if (liveness_share_alone(lfd) != 0)
        return liveness_share(lfd) == 0 ? SHL_OK : SHL_ESYS;
    if (!names_segment(name, st))
        return OPEN_AGAIN;      /* re-created already: the lock goes with lfd */
    if (segment_unused(hd, max, lfd, st))
        return unlink_exactly(name, st) < 0 ? SHL_ESYS : OPEN_AGAIN;
    liveness_share_again(lfd);
    return SHL_OK;
}
