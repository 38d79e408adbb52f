-- The self-check canary (issue 41): when an executor of a release that has not
-- passed its canary connects, a control-plane replica runs the contract canary
-- on that release by itself (control_plane/deploys/self_check.py). One replica
-- at a time per release: a replica takes the check with a conditional UPDATE
-- of canary_check_until (NULL or past: free), and that time bounds its claim,
-- so a replica that crashed mid-check blocks nobody past it. canary_check_by
-- says which executor's connect started it (ListReleases' reader may ask).

ALTER TABLE releases ADD COLUMN canary_check_until timestamptz;
ALTER TABLE releases ADD COLUMN canary_check_by text;
