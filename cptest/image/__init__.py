"""Images cptest makes itself (`build`) and the lock that pins every image a run may use (`lock`)."""
