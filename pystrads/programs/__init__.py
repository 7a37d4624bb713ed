"""The programs on the public Program API: LDA (:mod:`.lda`), matrix factorisation by coordinate
descent and SGD (:mod:`.mf`, implicit feedback in :mod:`.mf_implicit`), Lasso and L1 logistic
regression (:mod:`.lasso`, :mod:`.logistic`, with their row structures in :mod:`._rows`, the
Lasso's working-set solver in :mod:`._working_set` and the coefficient table in :mod:`._coef`), and small
example programs of each schedule shape (:mod:`.examples`)."""
