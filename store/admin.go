package store

import "context"

// Listings for the operator's command line (`relay admin list-users`,
// `list-projects`): every row, whoever owns it.

// Users lists every user, oldest first.
func (s *Store) Users(ctx context.Context) ([]User, error) {
	var us []User
	err := s.db.NewSelect().Model(&us).Order("created_at", "id").Scan(ctx)
	for i := range us {
		us[i].CreatedAt = fixTime(us[i].CreatedAt)
	}
	return us, err
}

// Projects lists every project, oldest first.
func (s *Store) Projects(ctx context.Context) ([]Project, error) {
	var ps []Project
	err := s.db.NewSelect().Model(&ps).Order("created_at", "id").Scan(ctx)
	for i := range ps {
		fixProject(&ps[i])
	}
	return ps, err
}
